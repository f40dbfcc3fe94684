"""`PipelinedSampling` (``max_staleness`` >= 1), against fake runners: the next step's
sampling is synced and launched before the update, and no trained group is older than the
bound (older ones are dropped and sampled again)."""

from __future__ import annotations

import numpy as np

from tests.conftest import tiny_config
from tests.helpers.sampling_parts import FakeDeadlines, Parts, groups_batch


class _RemoteRunners:
    """One remote env runner whose background request returns groups of version 0."""

    def __init__(self, calls: list[str], stuck: bool = False) -> None:
        self.calls, self.tags, self.stuck = calls, [], stuck
        self.timeouts: list[float | None] = []

    def num_remote_env_runners(self) -> int:
        return 1

    def healthy_env_runner_ids(self) -> list[int]:
        return [1]

    def foreach_env_runner_async(self, func, tag, remote_worker_ids):
        self.calls.append("launch")
        self.tags.append(tag)

    def num_in_flight_async_reqs(self, tag) -> int:
        return int(tag in self.tags)

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        self.calls.append("collect")
        self.timeouts.append(timeout_seconds)
        self.tags.remove(tags)
        return [] if self.stuck else [(1, (1, groups_batch([0] * 4), {}, {"position": 4}, 0.1))]


class _LearnerGroup:
    def foreach_learner(self, func):
        return [0]  # learner 0's weights sequence number before any update

    def _get_results(self, results):
        return results


def _pipelined(max_staleness=1, stuck=False, deadlines=False):
    from rllib_grpo.rllib.algorithm.sampling import PipelinedSampling

    parts = Parts(learners=_LearnerGroup())
    parts.runners = _RemoteRunners(parts.calls, stuck=stuck)
    kwargs = {**parts.kwargs(), "deadlines": FakeDeadlines(parts.calls) if deadlines else None}
    return PipelinedSampling(max_staleness=max_staleness, **kwargs), parts


def test_pipelined_sampling_syncs_and_launches_the_next_step_before_the_update():
    strategy, parts = _pipelined()
    # Step 1: nothing in flight, so sampled now; the next step launched before the update.
    rollout = strategy.sample(4)
    strategy.before_update(rollout, next_prompts=4)
    assert parts.calls == ["sample_on_runners", "sample(4@0)", "runner_metrics", "launch"]
    assert strategy.in_flight_prompts == 4  # not trained yet: a checkpoint samples them again
    assert parts.prompts.get_state(strategy.in_flight_prompts) == 4
    strategy.after_update()  # the runners are busy: no sync now
    assert parts.calls[-1] == "launch"
    # Step 2: take the background groups (one update old), sync the idle runners, launch.
    parts.calls.clear()
    rollout = strategy.sample(4)
    strategy.before_update(rollout, next_prompts=4)
    assert parts.calls == ["collect", "log_fault_counts", "runner_metrics", "sync_weights",
                           "launch"]
    assert parts.runner_states == {1: {"position": 4}}  # what a restarted runner resumes
    assert parts.logged["async/staleness_max"] == 1
    assert parts.prompts.position == 12
    strategy.reset()
    assert strategy.in_flight_prompts == 0


def test_a_runner_stuck_past_the_deadline_is_restarted_and_its_share_sampled_again():
    """The background request's deadline runs from its launch; a runner that has not
    answered by then, and that the runner pool still lists as healthy, is restarted by the
    recovery, and its share (the same prompt positions) is sampled again."""
    strategy, parts = _pipelined(stuck=True, deadlines=True)
    strategy.before_update(strategy.sample(4), next_prompts=4)  # launches positions 4-7
    strategy.after_update()
    parts.calls.clear()
    rollout = strategy.sample(4)
    assert parts.calls[:4] == ["waiting on env runner 1 (sampling)", "collect", "restart[1]",
                               "sample_on_runners"]
    assert 0 < parts.runners.timeouts[-1] <= 5.0  # what is left of 5 s since the launch
    assert parts.calls[4] == "sample(4@4)"  # the stuck runner's positions, sampled again
    assert "record sample" not in parts.calls  # a wait that expired is no median
    assert rollout.num_groups == 4 and parts.runner_states == {1: {"sampled_by": 1}}


def _with_ready(version: int, ready):
    """A pipeline at learner ``version`` holding ``ready`` (taken from the runners); its
    fresh samples, recorded in ``fresh_calls``, are groups of ``version``."""
    strategy, _ = _pipelined()
    strategy._learner_version = strategy._runner_version = version
    strategy._ready, strategy._ready_prompts = ready, ready.num_groups
    strategy.fresh_calls = []

    def sample_now(num_prompts):
        strategy.fresh_calls.append(num_prompts)
        return groups_batch([version] * num_prompts,
                            first_group=100 * len(strategy.fresh_calls))

    strategy.sample_now = sample_now
    return strategy


def test_groups_older_than_the_bound_are_dropped_and_sampled_again():
    # The background batch: 4 groups sampled with versions 4, 3, 4, 5 (3 is two updates old).
    strategy = _with_ready(5, groups_batch([4, 3, 4, 5]))
    rollout = strategy.sample(4)
    assert strategy.dropped_stale_groups == 1
    assert strategy.fresh_calls == [1]  # exactly the dropped group's place, sampled fresh
    staleness = 5 - rollout.weights_version
    assert len(rollout) == 8 and staleness.max() <= 1
    assert sorted(set(rollout.weights_version.tolist())) == [4, 5]
    assert rollout.num_groups == 4


def test_dynamic_sampling_counts_only_kept_groups_under_staleness():
    from rllib_grpo.rllib.algorithm.sampling import dynamic_sampling

    config = tiny_config(max_staleness=1, filter_groups=True, filter_groups_metric="seq_reward",
                         prompts_per_step=4)
    # Background batch: group 1 is two updates old (dropped), group 2 has no signal (filtered).
    strategy = _with_ready(5, groups_batch([4, 3, 4, 4], [True, True, False, True]))
    rollout, metrics = dynamic_sampling(strategy.draw, config)
    assert rollout.num_groups == 4 and (5 - rollout.weights_version).max() <= 1
    for g in np.unique(rollout.group_index):  # every trained group carries a signal
        assert np.std(rollout.scores[rollout.group_index == g]) > 0
    # 2 groups kept from the background batch + a fresh generation batch of 4 prompts.
    assert strategy.fresh_calls == [4] and strategy.dropped_stale_groups == 1
    assert metrics["train/num_gen_batches"] == 2
    assert metrics["filter_groups/discarded_surplus_groups"] == 2
