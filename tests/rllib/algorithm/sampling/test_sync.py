"""`SynchronousSampling`: sample with the current weights, update, then sync; engines that
share the learners' GPUs sleep through the update and wake in verl's order."""

from __future__ import annotations

from tests.helpers.sampling_parts import Parts, SampledRunner


class _LocalRunners:
    """A runner pool of one local env runner (its sampler's sleep/wake calls recorded)."""

    def __init__(self, calls: list[str]) -> None:
        self.local_env_runner = SampledRunner(calls)
        self.local_env_runner.sampler = type("Sampler", (), {
            "sleep": lambda _, level: calls.append(f"sleep({level})"),
            "wake_up": lambda _, tags: calls.append(f"wake_up({tags})")})()

    def num_remote_env_runners(self) -> int:
        return 0

    def foreach_env_runner(self, func, local_env_runner):
        assert local_env_runner
        return [func(self.local_env_runner)]


class _ReleasingLearners:
    """A local learner group whose learner records `release_memory`."""

    def __init__(self, calls: list[str]) -> None:
        self.learner = type("Learner", (), {
            "release_memory": lambda _: calls.append("release")})()

    def foreach_learner(self, func):
        return [func(self.learner)]

    def _get_results(self, results):
        return results


def _sync(sleep_level=None):
    from rllib_grpo.rllib.algorithm.sampling import SynchronousSampling

    parts = Parts()
    parts.runners, parts.learners = _LocalRunners(parts.calls), _ReleasingLearners(parts.calls)
    return SynchronousSampling(sleep_level=sleep_level, **parts.kwargs()), parts


def test_synchronous_sampling_syncs_after_each_update_and_only_then():
    strategy, parts = _sync()
    rollout = strategy.sample(4)
    strategy.before_update(rollout, next_prompts=4)
    assert parts.calls == ["sample(4@0)", "runner_metrics"]  # nothing launched or synced
    strategy.after_update()
    assert parts.calls[2:] == ["sync_weights"]
    assert "timing_s/update_weights" in parts.logged
    assert parts.logged["weight_sync/bytes"] == 1.0  # the sync's own metrics
    strategy.settle()
    strategy.reset()
    assert parts.calls[2:] == ["sync_weights"]
    assert strategy.in_flight_prompts == 0
    assert strategy.draw(8).num_groups == 8
    assert parts.calls[-2] == "sample(8@4)"  # the prompt order moved on
    assert parts.prompts.position == 12


def test_colocated_samplers_sleep_through_the_update_and_wake_weights_before_the_sync():
    strategy, parts = _sync(sleep_level=2)
    strategy.before_update(strategy.sample(4), next_prompts=4)
    strategy.after_update()
    strategy.reset()  # awake already: nothing to do
    assert parts.calls == ["sample(4@0)", "runner_metrics", "sleep(2)", "release",
                           "wake_up(['weights'])", "sync_weights", "release",
                           "wake_up(['kv_cache'])"]
    assert "timing_s/update_weights" in parts.logged
    strategy.before_update(strategy.sample(4), next_prompts=4)
    strategy.reset()  # an update that failed: the samplers wake for the next step
    assert parts.calls[-3:] == ["sleep(2)", "release", "wake_up(None)"]
