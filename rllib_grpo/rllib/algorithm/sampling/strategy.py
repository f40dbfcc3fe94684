"""`SamplingStrategy`: when the env runners sample and when they get the new weights.

A strategy is built once per algorithm from what it works with, never the algorithm
itself: the runner pool (RLlib's `EnvRunnerGroup`, through its public calls), the learner
group (the policy version), the `PromptOrder`, the weight sync, the run's `Deadlines`,
the recovery of lost or stuck runners (`RunnerRecovery`) and the result's `MetricsLogger`.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from rllib_grpo.data.recipes import GroupFilterStats, filter_groups, first_groups
from rllib_grpo.data.rollout import RolloutBatch, concat_rollouts

if TYPE_CHECKING:  # (annotations only: the strategies' unit tests run without RLlib objects)
    from ray.rllib.core.learner.learner_group import LearnerGroup
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

    from rllib_grpo.rllib.algorithm.deadlines import Deadlines
    from rllib_grpo.rllib.algorithm.sampling.prompt_order import PromptOrder
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

# ``func(env_runner, share)`` on the remote runners, one share each (runner i: shares[i-1]).
RunnerFunc = Callable[[Any, Any], Any]


class RunnerRecovery(Protocol):
    """What happens to a lost or stuck remote env runner
    (`rllib_grpo.rllib.algorithm.resilience.ResilientAlgorithm`)."""

    # A remote runner's state after its last good sample (what a restarted one resumes).
    runner_states: dict[int, dict]

    def sample_on_runners(self, func: RunnerFunc, shares: list[Any]) -> list[Any]:
        """``func`` per share on the remote runners; a lost runner's share sampled again."""

    def restart_stuck_runners(self, stuck: list[int], call: str, timeout_s: float,
                              rule: str) -> None:
        """Name the runners stuck in ``call`` past ``timeout_s`` and restart them."""

    def restore_env_runners(self, env_runner_group: EnvRunnerGroup) -> list[int]:
        """Bring restarted runners back with the current weights and data positions."""

    def log_fault_counts(self) -> None:
        """Restarts and resampled shares so far, into this step's result."""


class WeightPush(Protocol):
    """The weight sync (`rllib_grpo.rllib.algorithm.weight_sync.WeightSync`)."""

    def sync(self) -> dict[str, float]:
        """Push the learners' weights to every env runner; the sync's metrics."""


class SamplingStrategy(ABC):
    """One step of `GRPO.training_step` against a strategy:

        groups = strategy.sample(n)       (or dynamic sampling over strategy.draw)
        strategy.before_update(groups, next_prompts)
        update the learners on groups
        strategy.after_update()           (the new weights reach the runners, now or later)
    """

    def __init__(self, runners: EnvRunnerGroup, learners: LearnerGroup, prompts: PromptOrder,
                 weights: WeightPush, recovery: RunnerRecovery, deadlines: Deadlines | None,
                 metrics: MetricsLogger) -> None:
        self.runners = runners
        self.learners = learners
        self.prompts = prompts
        self.weights = weights
        self.recovery = recovery
        self.deadlines = deadlines
        self.metrics = metrics
        self._learner_version: int | None = None  # learner updates done (None: ask)

    # ---------------------------------------------------------------- the interface
    @abstractmethod
    def sample(self, num_prompts: int) -> RolloutBatch:
        """A step's ``num_prompts`` groups (without dynamic sampling)."""

    @abstractmethod
    def draw(self, num_prompts: int) -> RolloutBatch:
        """One generation batch of (up to) ``num_prompts`` groups, for dynamic sampling."""

    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:  # noqa: B027 (optional hook)
        """The step's groups are taken and the learners are about to update on them;
        ``next_prompts``: the prompts of the next step's (first) generation batch."""

    @abstractmethod
    def after_update(self) -> None:
        """The learners took one update."""

    def settle(self) -> None:  # noqa: B027 (optional hook)
        """Bring the env runners to the newest weights, idle (before a validation)."""

    def reset(self) -> None:  # noqa: B027 (optional hook)
        """Forget in-flight samples and versions (after a restore)."""

    @property
    def in_flight_prompts(self) -> int:
        """Prompts handed out by the prompt order whose groups are not trained yet."""
        return 0

    def sampler_idle_frac(self, step_seconds: float) -> float | None:
        """The env runners' idle share of the step where the strategy measures it (None:
        derived from the runners' generation time, `GRPO._log_idle_fractions`)."""
        return None

    # ---------------------------------------------------------------- shared parts
    def sample_now(self, num_prompts: int) -> RolloutBatch:
        """``num_prompts`` fresh groups on the runners' current weights: the next positions
        of the prompt order, runner ``k`` sampling the ``k``-th consecutive slice; a lost
        runner's slice is sampled again at the same positions by a healthy or restarted
        runner (`RunnerRecovery.sample_on_runners`)."""
        num_remote = self.runners.num_remote_env_runners()
        slices = self.prompts.claim(num_prompts, num_remote)
        if num_remote == 0:
            runner = self.runners.local_env_runner
            watch = (contextlib.nullcontext() if self.deadlines is None else
                     self.deadlines.watch("sample", "the local env runner (sampling)",
                                          kill=False))
            with watch:
                batches = [runner.sample(num_prompts=num_prompts, start=slices[0][0])]
            metrics = [runner.get_metrics()]
        else:
            results = self.recovery.sample_on_runners(
                lambda er, part: (er.sample(num_prompts=part[1], start=part[0]),
                                  er.get_metrics()), slices)
            batches = [b for b, _ in results if len(b)]
            metrics = [m for _, m in results]
            if not batches:
                raise RuntimeError(
                    f"None of the {num_remote} env runners returned samples (see their errors "
                    "above); healthy runners: "
                    f"{self.runners.num_healthy_remote_workers()}.")
        self.aggregate_runner_metrics(metrics)
        return concat_rollouts(batches, pad_token_id=0)

    def sync_weights(self) -> None:
        """Push the learners' weights to the runners (``timing_s/update_weights``)."""
        t0 = time.perf_counter()
        self.push_weights()
        self.log("timing_s/update_weights", time.perf_counter() - t0)

    def push_weights(self) -> None:
        """The weight sync itself, its metrics into the step's result."""
        for key, value in self.weights.sync().items():
            self.log(key, value)

    @property
    def learner_version(self) -> int:
        """Learner updates done: RLlib's weights sequence number of learner 0 (read once;
        the asynchronous strategies count their own updates after)."""
        if self._learner_version is None:
            self._learner_version = int(self.learners._get_results(self.learners.foreach_learner(
                lambda learner: learner._weights_seq_no))[0])
        return self._learner_version

    def log(self, key: str, value: float) -> None:
        """One value of this step's result."""
        self.metrics.log_value(key, float(value), reduce="mean", window=1)

    def aggregate_runner_metrics(self, metrics: list[dict]) -> None:
        """The env runners' metrics of one sample call, into the result's runner results."""
        from ray.rllib.utils.metrics import ENV_RUNNER_RESULTS

        self.metrics.aggregate(metrics, key=ENV_RUNNER_RESULTS)


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
