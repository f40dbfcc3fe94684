"""`ContinuousSampling`, the driver's side of continuous rollouts, against fake env runners
(no Ray, no engine): K steps' worth of groups handed out, the oldest versions trained
first, groups older than K dropped and sampled again at the same data positions, a lost
runner's in-flight groups handed to the others (and nothing else lost), weights published
with a pause and a resume around the sync, and the checkpoint position at the first
untrained prompt."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.versioned_batches import versioned_batch

P = 4  # prompts per step


class _Loop:
    """A runner's `RolloutLoop`: every take finishes the groups it was given, each sampled
    by ``version`` (the test moves it) or by what ``versions`` says for its position."""

    def __init__(self, calls: list[str]) -> None:
        self.calls, self.running, self.version = calls, [], 0
        self.versions: dict[int, int] = {}
        self.taken: list[int] = []

    def submit(self, positions):
        self.running += list(positions)
        return len(self.running)

    def take(self, wait_s):
        done = [(p, versioned_batch([self.versions.pop(p, self.version)], first_group=p))
                for p in self.running]
        self.taken += self.running
        self.running = []
        return {"groups": done, "busy_s": 1.0, "idle_s": 0.25, "running": 0, "metrics": {}}

    def pause(self):
        self.calls.append("pause")

    def resume(self):
        self.calls.append("resume")
        return {"pause_s": 0.0, "restarted_requests": 2.0}

    def suspend(self):
        self.calls.append("suspend")

    def reset(self):
        self.running = []


class _Runner:
    def __init__(self, index, calls):
        self.worker_index, self.rollout_loop = index, _Loop(calls)


class _Group:
    def __init__(self, num, calls):
        self.runners = {i: _Runner(i, calls) for i in range(1, num + 1)}
        self.lost: set[int] = set()

    def healthy_env_runner_ids(self):
        return [i for i in self.runners if i not in self.lost]

    def foreach_env_runner(self, func, local_env_runner, remote_worker_ids, healthy_only):
        assert not local_env_runner and healthy_only
        return [func(self.runners[i]) for i in remote_worker_ids if i not in self.lost]


def _strategy(num_runners=2, k=2):
    from rllib_grpo.rllib.algorithm.continuous import ContinuousSampling
    from rllib_grpo.rllib.algorithm.sampling import SamplingServices

    calls: list[str] = []
    group = _Group(num_runners, calls)
    position = [0]
    logged: dict[str, float] = {}

    def claim(n):
        start, position[0] = position[0], position[0] + n
        return [(start, n)]

    services = SamplingServices(
        env_runner_group=group, learner_group=None, sample_groups=None, claim_prompts=claim,
        sync_weights=lambda: calls.append("sync"), log_value=logged.__setitem__,
        sample_on_runners=None, log_fault_counts=lambda: None,
        aggregate_runner_metrics=lambda metrics: None, record_runner_state=None)
    strategy = ContinuousSampling(services, max_staleness=k, prompts_per_step=P)
    strategy._learner_version = 0
    return strategy, group, calls, logged


def test_k_steps_of_groups_are_handed_out_and_the_oldest_trained_first():
    strategy, group, calls, logged = _strategy(k=2)
    rollout = strategy.fill(P)
    assert rollout.num_groups == P
    # 2 x 4 positions handed out, spread over both runners.
    assert sorted(strategy._outstanding) == [4, 5, 6, 7]
    assert {len(r.rollout_loop.running) for r in group.runners.values()} == {0}
    strategy.before_update(rollout, P)
    assert sorted(strategy._outstanding) == list(range(4, 12))  # topped up to 2 steps
    assert logged["async/token_staleness_max"] == 0
    strategy.after_update()
    assert calls == ["pause", "pause", "sync", "resume", "resume"]
    assert logged["async/pauses_per_step"] == 2 and logged["async/restarted_requests"] == 4
    assert strategy.sampler_idle_frac(1.0) == pytest.approx(0.25 / 1.25)


def test_groups_older_than_k_are_dropped_and_their_prompts_sampled_again():
    strategy, group, _, logged = _strategy(num_runners=1, k=1)
    strategy._learner_version = 5
    loop = group.runners[1].rollout_loop
    loop.version = 5
    loop.versions = {1: 3}  # position 1: sampled 2 updates ago: too old for K=1
    rollout = strategy.fill(P)
    assert strategy.dropped_stale_groups == 1
    assert (5 - rollout.weights_version).max() <= 1 and rollout.num_groups == P
    # Position 1 was sampled again (at version 5), not skipped.
    assert sorted(int(g) for g in np.unique(rollout.group_index)) == [0, 1, 2, 3]
    strategy.before_update(rollout, P)
    assert logged["async/dropped_stale_groups"] == 1


def test_a_group_held_while_the_learner_moves_on_is_dropped_when_it_gets_too_old():
    strategy, group, _, _ = _strategy(num_runners=1, k=2)
    strategy.fill(P)  # 8 handed out at version 0, all finished: 4 trained, 4 held
    assert len(strategy._ready) == 4
    loop = group.runners[1].rollout_loop
    for version in (1, 2, 3):  # three updates: the held groups are now 3 > K old
        strategy._learner_version = version
        loop.version = version
    rollout = strategy.fill(P)
    assert strategy.dropped_stale_groups == 4
    assert (3 - rollout.weights_version).max() <= 2


def test_a_lost_runner_costs_only_its_in_flight_groups():
    strategy, group, _, logged = _strategy(num_runners=2, k=2)
    strategy._top_up()
    lost_positions = list(group.runners[2].rollout_loop.running)
    assert lost_positions  # runner 2 holds in-flight groups
    group.lost.add(2)
    rollout = strategy.fill(P)
    assert strategy.lost_groups == len(lost_positions)
    # Runner 1 took them over: every handed-out position is trained or still outstanding.
    trained = set(range(8)) - set(strategy._outstanding)
    assert len(trained) == P and rollout.num_groups == P
    assert set(strategy._outstanding.values()) <= {0, 1}  # runner 1, or finished (driver)
    strategy.before_update(rollout, P)
    assert logged["async/lost_groups"] == len(lost_positions)


def test_finished_groups_held_by_the_driver_are_not_lost_with_their_runner():
    strategy, group, _, _ = _strategy(num_runners=2, k=2)
    strategy.fill(P)  # 8 handed out, all finished: 4 trained, 4 held by the driver
    assert len(strategy._ready) == 4
    held_by_2 = [p for p, _ in strategy._ready if p in group.runners[2].rollout_loop.taken]
    assert held_by_2  # runner 2 finished some of the groups the driver holds
    group.lost.add(2)
    strategy._take()  # a round of taking notices the loss
    assert strategy.lost_groups == 0  # nothing of runner 2 was in flight
    rollout = strategy.fill(P)
    assert rollout.num_groups == P


def test_checkpoint_position_is_the_first_untrained_prompt_and_reset_forgets_all():
    strategy, _, _, _ = _strategy(num_runners=1, k=2)
    assert strategy.in_flight_prompts == 0
    strategy.fill(P)  # positions 0-7 handed out, 0-3 trained
    assert strategy.in_flight_prompts == 4  # the restored run starts at 8 - 4 = position 4
    strategy.reset()
    assert strategy.in_flight_prompts == 0 and strategy._learner_version is None


def test_a_validation_suspends_the_runners_and_the_next_step_resumes_them():
    strategy, _, calls, _ = _strategy(num_runners=1, k=1)
    strategy.fill(P)
    strategy.settle()
    assert calls == ["suspend"]
    strategy.fill(P)
    assert calls == ["suspend", "resume"]
