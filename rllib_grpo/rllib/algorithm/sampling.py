"""How the driver gets a step's groups: one interface, three strategies.

`GRPO.training_step` runs the paper's loop against a `SamplingStrategy`:

    groups = strategy.fill(n)            (or dynamic sampling over strategy.draw)
    strategy.before_update(groups, ...)
    update the learners on groups
    strategy.after_update()

* `SynchronousSampling` (``max_staleness`` = 0): sample with the current weights, update,
  then sync the new weights to the env runners.
* `rllib_grpo.rllib.algorithm.async_pipeline.PipelinedSampling` (``max_staleness`` >= 1):
  the next step's groups are sampled in the background while the learners update.
* `rllib_grpo.rllib.algorithm.continuous.ContinuousSampling` (``rollout_mode="continuous"``):
  the env runners never stop generating; weights load between two decode steps.

A strategy sees the algorithm only through `SamplingServices` (the env runner and
learner groups and a few of the driver's operations), never its private members.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rllib_grpo.data.recipes import GroupFilterStats, filter_groups, first_groups
from rllib_grpo.data.rollout import RolloutBatch, concat_rollouts
from rllib_grpo.rllib.choreography import EngineHandOver

if TYPE_CHECKING:  # (annotations only: the strategies' unit tests run without Ray)
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.rllib.env.env_runner_group import EnvRunnerGroup

    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

# ``func(env_runner, share)`` on the remote runners, one share each (runner i: shares[i-1]).
RunnerFunc = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class SamplingServices:
    """What a sampling strategy may use of the algorithm that drives it."""

    env_runner_group: EnvRunnerGroup
    learner_group: LearnerGroup
    # ``num_prompts`` fresh groups, sampled now on the env runners' current weights.
    sample_groups: Callable[[int], RolloutBatch]
    # The next ``num_prompts`` positions of the shared data order, ``(start, count)`` per
    # remote runner; the algorithm's data position moves on.
    claim_prompts: Callable[[int], list[tuple[int, int]]]
    # Push the learners' weights to every env runner.
    sync_weights: Callable[[], None]
    # One value of this step's result (``reduce="mean", window=1``).
    log_value: Callable[[str, float], None]
    # `ResilientAlgorithm.sample_on_runners`: a lost runner's share is sampled again.
    sample_on_runners: Callable[[RunnerFunc, list[Any]], list[Any]]
    # `ResilientAlgorithm.log_fault_counts`: restarts and resampled shares, every step.
    log_fault_counts: Callable[[], None]
    # The env runners' metrics of one sample call, into the result's env runner results.
    aggregate_runner_metrics: Callable[[list[dict]], None]
    # A remote runner's state after its last good sample (what a restarted one resumes).
    record_runner_state: Callable[[int, dict], None]
    # `ResilientAlgorithm.restore_env_runners`: bring lost runners back (continuous mode).
    restore_runners: Callable[[], Any] | None = None
    # The driver's `rllib_grpo.rllib.algorithm.deadlines.Deadlines` (None: no deadlines),
    # and `ResilientAlgorithm.restart_stuck_runners`(runners, call, timeout_s, rule).
    deadlines: Any = None
    restart_stuck_runners: Callable[[list[int], str, float, str], None] | None = None


def read_learner_version(learner_group: Any) -> int:
    """Learner updates done: RLlib's weights sequence number of learner 0 (one remote call;
    the asynchronous strategies read it once and count their own updates after)."""
    return int(learner_group._get_results(learner_group.foreach_learner(
        lambda learner: learner._weights_seq_no))[0])


class SamplingStrategy(ABC):
    """When the env runners sample and when they get the learners' new weights."""

    @abstractmethod
    def fill(self, num_prompts: int) -> RolloutBatch:
        """A step's ``num_prompts`` groups (without dynamic sampling)."""

    @abstractmethod
    def draw(self, num_prompts: int) -> RolloutBatch:
        """One generation batch of (up to) ``num_prompts`` groups, for dynamic sampling."""

    @abstractmethod
    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:
        """The step's groups are taken and the learners are about to update on them;
        ``next_prompts``: the prompts of the next step's (first) generation batch."""

    @abstractmethod
    def after_update(self) -> None:
        """The learners took one update."""

    @abstractmethod
    def settle(self) -> None:
        """Bring the env runners to the newest weights, idle (before a validation)."""

    @abstractmethod
    def reset(self) -> None:
        """Forget in-flight samples and versions (after a restore)."""

    @property
    @abstractmethod
    def in_flight_prompts(self) -> int:
        """Prompts handed out by the data order whose groups are not trained yet."""

    def sampler_idle_frac(self, step_seconds: float) -> float | None:
        """The env runners' idle share of the step where the strategy measures it (None:
        derived from the runners' generation time, `GRPO._log_idle_fractions`)."""
        return None


class SynchronousSampling(SamplingStrategy):
    """``max_staleness`` = 0: sample with the current weights, update, then sync.

    ``sleep_level`` (engines that share the learners' GPUs, ``config.sampler_sleeps``; None:
    they do not sleep): the engines sleep at that level during the update, giving their
    memory to the learners, and wake as `rllib_grpo.rllib.choreography` orders it: the
    learners free their cache, the engines wake their weights, the sync, the KV cache last.
    """

    def __init__(self, services: SamplingServices, sleep_level: int | None = None) -> None:
        self.services = services
        self.hand_over = None if sleep_level is None else EngineHandOver(
            services.env_runner_group, services.learner_group, sleep_level)
        self._asleep = False

    def fill(self, num_prompts: int) -> RolloutBatch:
        return self.services.sample_groups(num_prompts)

    def draw(self, num_prompts: int) -> RolloutBatch:
        return self.services.sample_groups(num_prompts)

    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:
        """The env runners wait for the new weights (their engines asleep, if they sleep)."""
        if self.hand_over is not None and not self._asleep:
            self.hand_over.sleep()
            self._asleep = True

    def after_update(self) -> None:
        """Sync the new weights (into woken engines), so that the next step samples with them."""
        t0 = time.perf_counter()
        if self.hand_over is not None and self._asleep:
            self.hand_over.wake_for_sync(self.services.sync_weights)
            self._asleep = False
        else:
            self.services.sync_weights()
        self.services.log_value("timing_s/update_weights", time.perf_counter() - t0)

    def settle(self) -> None:
        """Nothing: the env runners are idle and hold the newest weights after each step."""

    def reset(self) -> None:
        """No sample outlives its step; engines left asleep by a failed update wake (the
        restore that follows syncs its weights into them)."""
        if self.hand_over is not None and self._asleep:
            self.hand_over.wake()
            self._asleep = False

    @property
    def in_flight_prompts(self) -> int:
        return 0


def dynamic_sampling(draw: Callable[[int], RolloutBatch],
                     config: GRPOConfig) -> tuple[RolloutBatch, dict[str, float]]:
    """DAPO: ``config.prompts_per_step`` groups whose ``filter_groups_metric`` varies, from
    as many generation batches of ``gen_prompts_per_batch`` prompts (``draw``) as it takes
    (at most ``max_num_gen_batches``); returns them and the ``filter_groups/*`` metrics."""
    c = config
    gen_prompts = c.gen_prompts_per_batch or c.prompts_per_step
    kept, totals, num_batches, num_kept = [], GroupFilterStats(), 0, 0
    while num_kept < c.prompts_per_step:
        if 0 < c.max_num_gen_batches <= num_batches:
            raise RuntimeError(
                f"Dynamic sampling: {num_batches} generation batches gave only {num_kept} of "
                f"{c.prompts_per_step} groups whose {c.filter_groups_metric!r} varies "
                f"({totals.dropped_all_right} groups dropped all right, "
                f"{totals.dropped_all_wrong} all wrong): the data is too easy (mostly all "
                "right) or too hard (mostly all wrong) for the model. Change the data or "
                "raise max_num_gen_batches / gen_prompts_per_batch.")
        batch, stats = filter_groups(draw(gen_prompts), c.filter_groups_metric)
        num_batches += 1
        for name in ("kept", "dropped_all_right", "dropped_all_wrong", "dropped_other"):
            setattr(totals, name, getattr(totals, name) + getattr(stats, name))
        if len(batch):
            kept.append(batch)
            num_kept += stats.kept
    rollout = first_groups(concat_rollouts(kept, pad_token_id=0), c.prompts_per_step)
    return rollout, {
        "train/num_gen_batches": num_batches,
        "filter_groups/dropped_all_right": totals.dropped_all_right,
        "filter_groups/dropped_all_wrong": totals.dropped_all_wrong,
        "filter_groups/discarded_surplus_groups": num_kept - c.prompts_per_step,
    }
