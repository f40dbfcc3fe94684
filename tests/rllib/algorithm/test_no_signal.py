"""The driver's no-signal warning tells a learned task from a broken reward."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

LEARNED = "the task is learned or too easy"
BROKEN = "the reward parser never matches"
NO_DIVERSITY = "no sampling diversity"


class _Metrics:
    def __init__(self, values: dict[str, float]) -> None:
        self.values = values

    def peek(self, key: str, default: float | None = None) -> float | None:
        return self.values.get(key, default)


def _warnings(caplog, flat: float, right: float, wrong: float, steps: int = 4) -> list[str]:
    """The warnings of `GRPO._warn_if_no_signal` over ``steps`` steps of these fractions."""
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    driver = SimpleNamespace(
        metrics=_Metrics({"groups/zero_variance_frac": flat, "groups/all_right_frac": right,
                          "groups/all_wrong_frac": wrong}),
        _no_signal_streak=0)
    with caplog.at_level(logging.WARNING, logger="rllib_grpo.rllib.algorithm.grpo"):
        for _ in range(steps):
            GRPO._warn_if_no_signal(driver)
    return [record.getMessage() for record in caplog.records]


@pytest.mark.parametrize("flat, right, wrong", [(0.75, 0.72, 0.03), (0.69, 0.69, 0.0),
                                                (1.0, 1.0, 0.0)])
def test_mostly_all_right_groups_say_the_task_is_learned_not_broken(caplog, flat, right, wrong):
    """`make demo`'s end: 69-75% of groups all right."""
    (warning,) = _warnings(caplog, flat, right, wrong)
    assert LEARNED in warning and "harder prompts" in warning, warning
    assert BROKEN not in warning and NO_DIVERSITY not in warning
    assert f"{100 * right:.0f}% all right" in warning


@pytest.mark.parametrize("flat, right, wrong", [(1.0, 0.0, 1.0), (0.9, 0.1, 0.8),
                                                (0.6, 0.25, 0.3)])
def test_mostly_all_wrong_groups_still_point_at_the_parser(caplog, flat, right, wrong):
    (warning,) = _warnings(caplog, flat, right, wrong)
    assert BROKEN in warning and "too hard" in warning and LEARNED not in warning, warning


def test_one_partial_score_per_group_points_at_diversity(caplog):
    (warning,) = _warnings(caplog, 0.8, 0.0, 0.1)
    assert NO_DIVERSITY in warning and LEARNED not in warning and BROKEN not in warning


def test_no_warning_while_most_groups_vary(caplog):
    assert _warnings(caplog, 0.5, 0.5, 0.0, steps=10) == []
