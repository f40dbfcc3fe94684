"""`GRPO`: the RLlib Algorithm.  Its `training_step` is the paper's loop:

    sample groups (-> dynamic sampling) -> update the policy on whole groups
    -> sync weights to the samplers -> metrics

When the samplers sample and get the new weights is the sampling strategy's, chosen once
from the config (`rllib_grpo.rllib.algorithm.sampling`): synchronous at ``max_staleness`` = 0;
with ``max_staleness`` >= 1 the next step's sampling runs in the background during the
update, or the runners never stop (``rollout_mode="continuous"``; docs/async.md).
Tensor math lives in the learner (`rllib_grpo.rllib.learner.learner`) and `rllib_grpo.algos`;
sampling and scoring in the env runners (`rllib_grpo.rllib.env_runner.env_runner`).
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import uuid
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)
from ray.tune.execution.placement_groups import PlacementGroupFactory
from ray.tune.registry import register_trainable
from ray.tune.trainable import Trainable

from rllib_grpo.data.rollout import RolloutBatch, data_metrics
from rllib_grpo.rllib.algorithm.deadlines import Deadlines
from rllib_grpo.rllib.algorithm.evaluation import EvaluatingAlgorithm
from rllib_grpo.rllib.algorithm.no_signal import no_signal_warning
from rllib_grpo.rllib.algorithm.placement_group import RunPlacement
from rllib_grpo.rllib.algorithm.reward_workers import RewardActors
from rllib_grpo.rllib.algorithm.sampling import (
    PromptOrder,
    SamplingStrategy,
    choose_strategy,
    dynamic_sampling,
)
from rllib_grpo.rllib.algorithm.weight_sync import WeightSync
from rllib_grpo.rllib.config.grpo_config import RUN_PLACEMENT_GROUP, GRPOConfig
from rllib_grpo.rllib.learner.perf import LEARNER_METRIC_NAMESPACES
from rllib_grpo.rllib.stacks import RUN_ID_ATTRIBUTE

logger = logging.getLogger(__name__)
REMOTE_RUNNERS = "remote_env_runners"
DATA_POSITION = "data_position"  # prompts served so far, in the env runners' shared order
NO_SIGNAL_WARNING_AFTER = 3  # training steps in a row where most groups carry no signal
# Seconds from launch to the first training step, in the first result.
STARTUP_KEY = "timing_s/startup"


class GRPO(EvaluatingAlgorithm):
    """Group Relative Policy Optimization for language models on RLlib's new API stack.

    Validation as RLlib's evaluation comes from `EvaluatingAlgorithm`; checkpoint safety,
    resume and env runner restarts from `ResilientAlgorithm`."""

    @override(Algorithm)
    @classmethod
    def get_default_config(cls) -> GRPOConfig:
        return GRPOConfig()

    @override(Algorithm)
    def setup(self, config: Any) -> None:
        self._startup_origin = startup_origin()
        c = self.config
        # Every wait has a deadline (rllib_grpo.rllib.algorithm.deadlines); every process of
        # the run registers for stack dumps under this run id, which the config carries to
        # the env runners and learners.
        self.deadlines = Deadlines(
            uuid.uuid4().hex[:12], factor=c.step_timeout_factor, floor_s=c.step_timeout_floor_s,
            folder=self._report_folder,
            trial_id=self._trial_info.trial_id if self._trial_info is not None else None)
        object.__setattr__(c, RUN_ID_ATTRIBUTE, self.deadlines.run_id)
        try:
            self._set_up(config)
        except BaseException:
            self._stop_started_parts()
            raise

    def _set_up(self, config: Any) -> None:
        """`setup`'s body, within the start-up deadline (``startup_timeout_s``)."""
        with self.deadlines.startup(self.config.startup_timeout_s):
            # Every process in its seat of one placement group (rllib_grpo.rllib.algorithm.
            # placement_group); none for a CPU-only run built outside Tune.
            self._placement = RunPlacement.start(self.config, self.config.startup_timeout_s)
            if self._placement is not None:
                object.__setattr__(self.config, RUN_PLACEMENT_GROUP, self._placement.group)
                self.deadlines.run_group = self._placement.group
            # Reward models and judges run on Ray actors of their own, started before the
            # env runners that score through them (rllib_grpo.rllib.algorithm.reward_workers).
            self._reward_actors = RewardActors.start(self.config, self._placement)
            with (self._placement.env_runner_groups() if self._placement is not None
                  else contextlib.nullcontext()):
                super().setup(config)
            if self._placement is not None:
                self._placement.check_learners(self.learner_group)
        self._no_signal_streak = 0
        self._startup_logged = False
        self.last_rollout: RolloutBatch | None = None
        # The paper's loop, sample -> update -> sync, runs against a sampling strategy
        # (`rllib_grpo.rllib.algorithm.sampling`) built from the parts it works with.
        self.prompt_order = PromptOrder()
        weight_sync = WeightSync(self)
        self._weight_sync: WeightSync | None = weight_sync
        self.sampling: SamplingStrategy = choose_strategy(
            self.config, self._generation_batch_prompts(), runners=self.env_runner_group,
            learners=self.learner_group, prompts=self.prompt_order, weights=weight_sync,
            recovery=self, deadlines=self.deadlines, metrics=self.metrics)

    def _report_folder(self) -> str:
        """Where stack files go: the Tune trial's folder where it is on this machine, else
        the algorithm's log folder."""
        trial_dir = getattr(getattr(self, "_storage", None), "trial_fs_path", None)
        if trial_dir and "://" not in str(trial_dir) and Path(trial_dir).is_dir():
            return str(trial_dir)
        return str(self.logdir)

    def _stop_started_parts(self) -> None:
        """After a failed set-up: the reward actors, an own placement group and the
        deadlines' watchdog go (RLlib's cleanup does not run)."""
        reward_actors = getattr(self, "_reward_actors", None)
        placement = getattr(self, "_placement", None)
        with contextlib.suppress(Exception):
            if reward_actors is not None:
                reward_actors.stop()
            if placement is not None:
                placement.close()
        self.deadlines.close()

    @override(Algorithm)
    def training_step(self) -> None:
        """sample -> update the policy on the groups -> the new weights to the samplers."""
        t_step = time.perf_counter()
        if not self._startup_logged:
            self._startup_logged = True
            self._log_value(STARTUP_KEY, time.time() - self._startup_origin)

        # The paper's loop; when the new weights reach the samplers is the strategy's.
        rollout = self._sample_step()
        self.sampling.before_update(rollout, self._generation_batch_prompts())
        update_time = self._update_learners(rollout)
        self.sampling.after_update()
        self._log_step(rollout, time.perf_counter() - t_step, update_time)

    def _update_learners(self, rollout: RolloutBatch) -> float:
        """One policy update on the step's groups (advantages, loss and optimizer step are
        the learners'); returns its seconds."""
        t0 = time.perf_counter()
        with self.waiting_on_learners("update", "update"):
            learner_results = self.learner_group.update(
                batch=self._to_learner_batch(rollout),
                timesteps={NUM_ENV_STEPS_SAMPLED_LIFETIME: self.metrics.peek(
                    (ENV_RUNNER_RESULTS, NUM_ENV_STEPS_SAMPLED_LIFETIME), default=0)},
            )
        self.metrics.aggregate(learner_results, key=LEARNER_RESULTS)
        update_time = time.perf_counter() - t0
        self._log_value("timing_s/update_actor", update_time)
        self._surface_learner_metrics()
        self._stop_if_nothing_learned(rollout)
        return update_time

    def _log_step(self, rollout: RolloutBatch, step_time: float, update_time: float) -> None:
        """The step's seconds, tokens and throughput, and the idle fractions."""
        tokens = float(rollout.prompt_lengths.sum() + rollout.response_lengths.sum())
        self._log_value("timing_s/step", step_time)
        self._log_value("perf/total_num_tokens", tokens)
        self._log_value("perf/time_per_step", step_time)
        self._log_value("perf/throughput", tokens / max(step_time, 1e-9))
        self._log_idle_fractions(step_time, update_time)

    def _log_idle_fractions(self, step_time: float, update_time: float) -> None:
        """``async/learner_idle_frac``: 1 - learner update seconds / step seconds;
        ``async/sampler_idle_frac``: 1 - the env runners' generation + reward seconds of the
        step's (last) sample call / step seconds (docs/async.md).  Logged in both modes."""
        busy = sum(self.metrics.peek((ENV_RUNNER_RESULTS, key), default=0.0)
                   for key in ("timing_s/gen", "timing_s/reward"))
        step = max(step_time, 1e-9)
        measured = self.sampling.sampler_idle_frac(step_time)  # continuous: the runners'
        self._log_value("async/learner_idle_frac", min(1.0, max(0.0, 1 - update_time / step)))
        self._log_value("async/sampler_idle_frac", min(1.0, max(0.0, 1 - busy / step))
                        if measured is None else measured)

    def _generation_batch_prompts(self) -> int:
        """Prompts of one generation batch (dynamic sampling draws several per step)."""
        c = self.config
        return (c.gen_prompts_per_batch or c.prompts_per_step) if c.filter_groups \
            else c.prompts_per_step

    @override(Algorithm)
    def _before_evaluate(self) -> None:
        """The env runners idle, with the newest weights, before a validation."""
        self.sampling.settle()

    def _sync_weights(self) -> None:
        """Push the learners' weights to every sampler before the next sample: the driver
        asks the learners to offer and the env runners to receive, by the path the
        placement allows (`rllib_grpo.rllib.algorithm.weight_sync`)."""
        self.sampling.push_weights()

    @override(Algorithm)
    def cleanup(self) -> None:
        weight_sync = getattr(self, "_weight_sync", None)
        if weight_sync is not None:
            weight_sync.close()
            self._weight_sync = None
        super().cleanup()
        reward_actors = getattr(self, "_reward_actors", None)
        if reward_actors is not None:
            reward_actors.stop()
        placement = getattr(self, "_placement", None)
        if placement is not None:
            placement.close()
        deadlines = getattr(self, "deadlines", None)
        if deadlines is not None:
            deadlines.close()

    @override(Algorithm)
    @classmethod
    def default_resource_request(cls, config: Any) -> PlacementGroupFactory:
        """Every process of the run, one bundle each (GPUs: one bundle per GPU): the main
        process, learners, env runners, their engines' shards, evaluation env runners and
        reward workers (`GRPOConfig.placement_plan`); Tune reserves the trial's placement
        group from it and the run seats each process in its bundle."""
        if not isinstance(config, GRPOConfig):
            config = cls.get_default_config().update_from_dict(config)
        plan = config.placement_plan()
        return PlacementGroupFactory(plan.bundle_specs(), strategy=plan.strategy)

    # ------------------------------------------------------------------ checkpoints
    @override(Algorithm)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict:
        """RLlib's state plus the remote runners' data positions and RNG streams.

        (A local env runner is its own checkpoint component already.)
        """
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self._check_component(DATA_POSITION, components, not_components):
            # In-flight samples are not saved: a restored run samples their prompts again.
            state[DATA_POSITION] = self.prompt_order.get_state(self.sampling.in_flight_prompts)
        group = self.env_runner_group
        if group is not None and group.num_remote_env_runners() > 0 and self._check_component(
                REMOTE_RUNNERS, components, not_components):
            state[REMOTE_RUNNERS] = group.foreach_env_runner(
                lambda er: (er.worker_index, er.get_state()), local_env_runner=False)
        return state

    @override(Algorithm)
    def set_state(self, state: dict) -> None:
        """RLlib's, plus the remote runners' data positions; restored learner weights
        reach every sampler before the next sample."""
        super().set_state(state)
        self.sampling.reset()  # restored weights and data: start the pipeline clean
        if DATA_POSITION in state:
            self.prompt_order.set_state(state[DATA_POSITION])
        if REMOTE_RUNNERS in state and self.env_runner_group is not None:
            by_index = dict(state[REMOTE_RUNNERS])
            self.runner_states.update(by_index)  # what a restarted runner continues from
            self.env_runner_group.foreach_env_runner(
                lambda er: er.set_state(by_index[er.worker_index])
                if er.worker_index in by_index else None, local_env_runner=False)
        if COMPONENT_LEARNER_GROUP in state:
            self.samplers_take_restored_weights()

    @override(Trainable)
    def export_model(self, path: str, *, dtype: str | None = None, lora_mode: str = "merge",
                     overwrite: bool = False) -> str:
        """Write the current policy as a Hugging Face model folder; returns its path.

        (Replaces Tune's ``Trainable.export_model(export_formats, export_dir)``, whose
        RLlib implementation serves old-API-stack policies only; nothing in Ray calls it.)

        The learners' full state (gathered from every FSDP shard) goes through
        `rllib_grpo.models.export.export_module_state`: safetensors shards, config,
        generation config and the base model's tokenizer.  With LoRA the adapter is
        merged (``lora_mode="merge"``) or written as a PEFT folder (``"adapter"``).
        ``dtype`` None keeps the learner's.  For a checkpoint on disk use
        ``rllib-grpo export`` (`rllib_grpo.cli.export_command.export_checkpoint`).
        """
        from rllib_grpo.models.export import export_module_state

        state = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
        )[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]
        c = self.config
        return export_module_state(state, c.model_path, path, dtype=dtype, lora_mode=lora_mode,
                                   base_dtype=c.compute_dtype, overwrite=overwrite).path

    # ------------------------------------------------------------------ sampling
    def _sample_step(self) -> RolloutBatch:
        """One step's groups; with dynamic sampling (DAPO), only groups with a signal."""
        c = self.config
        t0 = time.perf_counter()
        if c.filter_groups:
            rollout, metrics = dynamic_sampling(self.sampling.draw, c)
            self._log_dict(metrics)
        else:
            rollout = self.sampling.sample(c.prompts_per_step)
        # The step's own seconds (window=1), not RLlib's log_time moving average.
        self._log_value("timing_s/sample", time.perf_counter() - t0)
        self._log_dict(data_metrics(rollout, c.max_response_length))
        self._warn_if_no_signal()
        self.last_rollout = rollout
        return rollout

    def _to_learner_batch(self, rollout: RolloutBatch) -> MultiAgentBatch:
        columns = rollout.train_columns()
        return MultiAgentBatch(
            {DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=len(rollout)
        )

    # ------------------------------------------------------------------ metrics
    def _log_value(self, key: str, value: float) -> None:
        self.metrics.log_value(key, float(value), reduce="mean", window=1)

    def _log_dict(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._log_value(key, value)

    def _surface_learner_metrics(self) -> None:
        """The learner's metrics in verl's namespaces, at the top level under their names."""
        learner = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID), default={})
        for key, value in learner.items():
            if key.startswith(LEARNER_METRIC_NAMESPACES) and not math.isnan(value):
                self._log_value(key, value)

    def _warn_if_no_signal(self) -> None:
        flat = self.metrics.peek("groups/zero_variance_frac", default=0.0)
        self._no_signal_streak = self._no_signal_streak + 1 if flat > 0.5 else 0
        if self._no_signal_streak == NO_SIGNAL_WARNING_AFTER:
            right = self.metrics.peek("groups/all_right_frac", default=0.0)
            wrong = self.metrics.peek("groups/all_wrong_frac", default=0.0)
            logger.warning(no_signal_warning(self._no_signal_streak, flat, right, wrong))


def startup_origin() -> float:
    """When start-up began, for ``timing_s/startup`` (seconds until the first training step).

    In a driver: when the process started (imports and ``ray.init`` included).  Inside a
    Ray actor (a Tune trial), whose process may have idled in Ray's worker pool: now, as
    the algorithm is being built.
    """
    import psutil

    try:
        in_actor = ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None
    except Exception:  # noqa: BLE001  (no usable runtime context: count from process start)
        in_actor = False
    return time.time() if in_actor else psutil.Process().create_time()


def register() -> None:
    """Register `GRPO` with Ray Tune's registry under ``"GRPO"`` (idempotent)."""
    register_trainable("GRPO", GRPO)


# Importing the algorithm registers it, as RLlib's own algorithms are known to Tune.  Tune's
# registry keeps the class in Ray's GCS once Ray is up, so Ray workers (a Tune trial's actor)
# find it there without importing this module first.
register()
