"""The driver's sampling strategies (`rllib_grpo.rllib.algorithm.sampling`): the synchronous
one syncs the weights after each update, the pipelined one syncs and launches the next
step's sampling before it, and `GRPO.training_step` runs whichever it is given in the same
order, with no branch on the mode."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from tests.conftest import tiny_config
from tests.helpers.versioned_batches import versioned_batch


class _Driver:
    """The algorithm's side of `SamplingServices`, recording each call in order."""

    def __init__(self, versions: list[int]) -> None:
        self.calls: list[str] = []
        self.logged: dict[str, float] = {}
        self.versions = versions  # the weights version of each fresh sample's groups
        self.position = 0

    def services(self, env_runner_group=None, learner_group=None):
        from rllib_grpo.rllib.algorithm.sampling import SamplingServices

        return SamplingServices(
            env_runner_group=env_runner_group, learner_group=learner_group,
            sample_groups=self.sample_groups, claim_prompts=self.claim_prompts,
            sync_weights=lambda: self.calls.append("sync_weights"),
            log_value=self.logged.__setitem__,
            sample_on_runners=lambda func, shares: pytest.fail("no runner was lost"),
            log_fault_counts=lambda: self.calls.append("log_fault_counts"),
            aggregate_runner_metrics=lambda metrics: self.calls.append("runner_metrics"),
            record_runner_state=lambda index, state: self.calls.append(f"state_{index}"))

    def sample_groups(self, num_prompts: int):
        self.calls.append(f"sample_groups({num_prompts})")
        return versioned_batch(self.versions[:1] * num_prompts)

    def claim_prompts(self, num_prompts: int) -> list[tuple[int, int]]:
        self.calls.append(f"claim_prompts({num_prompts})")
        self.position += num_prompts
        return [(self.position - num_prompts, num_prompts)]


class _RunnerGroup:
    """One remote env runner whose background request returns groups of version 0."""

    def __init__(self, driver: _Driver) -> None:
        self.driver, self.tags = driver, []

    def healthy_env_runner_ids(self) -> list[int]:
        return [1]

    def foreach_env_runner_async(self, func, tag, remote_worker_ids):
        self.driver.calls.append("launch")
        self.tags.append(tag)

    def num_in_flight_async_reqs(self, tag) -> int:
        return int(tag in self.tags)

    def fetch_ready_async_reqs(self, tags, timeout_seconds):
        self.driver.calls.append("collect")
        self.tags.remove(tags)
        return [(1, (1, versioned_batch([0] * 4), {}, {"position": 4}, 0.1))]


class _LearnerGroup:
    def foreach_learner(self, func):
        return [0]  # learner 0's weights sequence number before any update

    def _get_results(self, results):
        return results


def test_synchronous_sampling_syncs_after_each_update_and_only_then():
    from rllib_grpo.rllib.algorithm.sampling import SynchronousSampling

    driver = _Driver(versions=[0])
    strategy = SynchronousSampling(driver.services())
    rollout = strategy.fill(4)
    strategy.before_update(rollout, next_prompts=4)
    assert driver.calls == ["sample_groups(4)"]  # nothing launched, nothing synced
    strategy.after_update()
    assert driver.calls == ["sample_groups(4)", "sync_weights"]
    assert "timing_s/update_weights" in driver.logged
    strategy.settle()
    strategy.reset()
    assert driver.calls == ["sample_groups(4)", "sync_weights"]
    assert strategy.in_flight_prompts == 0
    assert strategy.draw(8).num_groups == 8


def test_pipelined_sampling_syncs_and_launches_the_next_step_before_the_update():
    from rllib_grpo.rllib.algorithm.async_pipeline import PipelinedSampling

    driver = _Driver(versions=[0])
    strategy = PipelinedSampling(
        driver.services(_RunnerGroup(driver), _LearnerGroup()), max_staleness=1)
    # Step 1: nothing in flight, so sampled now; the next step launched before the update.
    rollout = strategy.fill(4)
    strategy.before_update(rollout, next_prompts=4)
    assert driver.calls == ["sample_groups(4)", "claim_prompts(4)", "launch"]
    assert strategy.in_flight_prompts == 4  # not trained yet: a checkpoint samples them again
    strategy.after_update()  # the runners are busy: no sync now
    assert driver.calls[-1] == "launch"
    # Step 2: take the background groups (one update old), sync the idle runners, launch.
    driver.calls.clear()
    rollout = strategy.fill(4)
    strategy.before_update(rollout, next_prompts=4)
    assert driver.calls == ["collect", "log_fault_counts", "state_1", "runner_metrics",
                            "sync_weights", "claim_prompts(4)", "launch"]
    assert driver.logged["async/staleness_max"] == 1
    strategy.reset()
    assert strategy.in_flight_prompts == 0


def test_training_step_has_no_branch_on_the_sampling_mode():
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    source = textwrap.dedent(inspect.getsource(GRPO.training_step))
    tests = [ast.unparse(node.test) for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.If | ast.IfExp)]
    assert tests and not [t for t in tests if "sampling" in t or "staleness" in t
                          or "pipeline" in t], tests


def test_training_step_runs_the_strategy_it_is_given_in_the_papers_order(ray_session):
    """A recording strategy injected in a built algorithm: sample -> before_update ->
    update -> after_update (the weight sync) -> settle before a validation."""
    from rllib_grpo.rllib.algorithm.sampling import SamplingStrategy

    algo = tiny_config(val_every=1, val_num_prompts=2).build_algo()
    calls: list[str] = []
    real = algo._sampling

    class Recording(SamplingStrategy):
        def fill(self, num_prompts):
            calls.append("fill")
            return real.fill(num_prompts)

        def draw(self, num_prompts):
            calls.append("draw")
            return real.draw(num_prompts)

        def before_update(self, rollout, next_prompts):
            calls.append("before_update")

        def after_update(self):
            calls.append("after_update")
            real.after_update()

        def settle(self):
            calls.append("settle")

        def reset(self):
            calls.append("reset")

        @property
        def in_flight_prompts(self):
            return 0

    try:
        update = algo.learner_group.update
        algo.learner_group.update = lambda **kw: calls.append("update") or update(**kw)
        algo._sampling = Recording()
        algo.train()
        assert calls == ["fill", "before_update", "update", "after_update", "settle"]
    finally:
        algo.stop()


class _SleepingRunners:
    """The local env runner of a colocated run: its sampler's sleep/wake calls, in order."""

    def __init__(self, driver: _Driver) -> None:
        self.driver = driver
        self.runner = type("Runner", (), {})()
        self.runner.sampler = type("Sampler", (), {
            "sleep": lambda _, level: driver.calls.append(f"sleep({level})"),
            "wake_up": lambda _, tags: driver.calls.append(f"wake_up({tags})")})()

    def foreach_env_runner(self, func, local_env_runner):
        assert local_env_runner
        return [func(self.runner)]


class _ReleasingLearners:
    """A local learner group whose learner records `release_memory`."""

    def __init__(self, driver: _Driver) -> None:
        self.learner = type("Learner", (), {
            "release_memory": lambda _: driver.calls.append("release")})()

    def foreach_learner(self, func):
        return [func(self.learner)]

    def _get_results(self, results):
        return results


def test_colocated_samplers_sleep_through_the_update_and_wake_weights_before_the_sync():
    from rllib_grpo.rllib.algorithm.sampling import SynchronousSampling

    driver = _Driver(versions=[0])
    strategy = SynchronousSampling(driver.services(_SleepingRunners(driver),
                                                   _ReleasingLearners(driver)), sleep_level=2)
    strategy.before_update(strategy.fill(4), next_prompts=4)
    strategy.after_update()
    strategy.reset()  # awake already: nothing to do
    assert driver.calls == ["sample_groups(4)", "sleep(2)", "release", "wake_up(['weights'])",
                            "sync_weights", "release", "wake_up(['kv_cache'])"]
    strategy.before_update(strategy.fill(4), next_prompts=4)
    strategy.reset()  # an update that failed: the samplers wake for the next step
    assert driver.calls[-3:] == ["sleep(2)", "release", "wake_up(None)"]
