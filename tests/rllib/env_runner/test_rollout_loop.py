"""The env runner's `RolloutLoop` (single-turn), against the fake stream of
`test_continuous_episodes`: a reset (a restore) that lands while the loop scores the groups
of one engine step must neither kill the loop nor let those groups out after it; a loop that
dies says so at the driver's next take instead of leaving the driver waiting forever."""

from __future__ import annotations

import threading

import pytest

from rllib_grpo.data.trajectory import EpisodeLimits
from tests.helpers.continuous_runner import fake_runner, take_all


def always_seven(context: str) -> str:
    return "7"


def _single_turn_runner(score):
    runner, stream = fake_runner(always_seven, EpisodeLimits(8), group_size=1)
    runner._episodes = None
    runner._score_many = score
    return runner, stream


def test_a_reset_while_the_loop_scores_drops_those_groups_and_the_loop_goes_on():
    """Two groups finish in one engine step; while the first is being scored the driver
    resets the loop (a restore).  Before the fix the loop popped the second group's position
    after the reset had cleared them: KeyError, the loop thread died, and the driver's takes
    came back empty forever (the CI hang of
    test_a_restore_drops_in_flight_groups_and_samples_from_the_first_untrained_prompt)."""
    from rllib_grpo.rllib.env_runner.rollout_loop import RolloutLoop

    scoring, release = threading.Event(), threading.Event()
    blocked = {"first": True}

    def score(env, items):
        if blocked.pop("first", False):
            scoring.set()
            assert release.wait(10)
        return [{"reward": 1.0, "index": prompt["index"]} for prompt, _ in items]

    runner, stream = _single_turn_runner(score)
    loop = RolloutLoop(runner)
    try:
        loop.submit([3, 4])  # one token each: both finish in the first step
        assert scoring.wait(10)
        loop.reset()  # the restore, while the loop scores group 3
        release.set()
        assert loop.take(wait_s=0.5)["groups"] == []  # neither pre-reset group gets out
        loop.submit([3, 4])  # the restore samples from the first untrained prompt again
        done = take_all(loop, 2)
        assert sorted(position for position, _ in done) == [3, 4]
        assert loop._thread.is_alive()
    finally:
        release.set()
        loop.close()


def test_a_dead_loop_is_reported_at_the_next_take():
    from rllib_grpo.rllib.env_runner.rollout_loop import RolloutLoop

    def score(env, items):
        raise ValueError("the reward env broke")

    runner, _ = _single_turn_runner(score)
    loop = RolloutLoop(runner)
    try:
        loop.submit([0])
        with pytest.raises(RuntimeError, match="rollout loop died: ValueError"):
            for _ in range(100):
                loop.take(wait_s=0.1)
    finally:
        loop.close()
