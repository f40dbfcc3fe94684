"""The rollout-modes suite's bookkeeping: per-mode means over rounds, ratios to sync."""

from __future__ import annotations

import pytest


def run_row(mode: str, per_min: float, curve: list[float]) -> dict:
    return {"mode": mode, "trajectories_per_min": per_min, "learner_idle_frac": 0.5,
            "sampler_idle_frac": 0.25, "response_length_mean": 20.0, "staleness_max": 1.0,
            "reward_curve": curve}


def test_rounds_in_any_order_average_per_mode_and_ratios_are_to_sync():
    from benchmarks.rollout_modes import mean_rows, mode_rows

    first = [run_row("sync", 100.0, [0.25, 0.5]), run_row("continuous_k2", 150.0, [0.5])]
    second = [run_row("continuous_k2", 250.0, [0.75, 1.0]), run_row("sync", 100.0, [0.75])]
    rows = {r["mode"]: r for r in mode_rows(mean_rows([first, second]))}
    assert list(rows) == ["sync", "continuous_k2"]  # the MODES order, not the run order
    assert rows["continuous_k2"]["trajectories / min"] == 200.0
    assert rows["continuous_k2"]["x sync"] == 2.0
    assert rows["continuous_k2"]["x one_step_off"] is None  # not run
    # the curve up to the bin every round reached: sync (0.25+0.75)/2, k2 (0.5+0.75)/2
    assert rows["sync"]["reward, last bin"] == pytest.approx(0.5)
    assert rows["continuous_k2"]["reward, last bin"] == pytest.approx(0.625)
    assert rows["sync"]["trajectories seen"] == 256


def test_digit_share_is_the_share_of_digits():
    from benchmarks.rollout_modes import digit_share

    assert digit_share("", "12ab", None) == 0.5
    assert digit_share("", "", None) == 0.0
