"""The measured run: `GRPOConfig().build_algo().train()` with its phases timed.

The learner and the env runner live in this (the driver) process
(``num_learners=0``, ``num_env_runners=0``), so the phases the framework does not
log itself are timed by wrapping the functions that do them (probes), without
changing the project's code:

* generation: the sampler's ``generate``;  reward: ``TextEnvRunner._score_many``;
* old_log_prob: `response_log_probs` as the learner's forward passes call it
  (`rllib_grpo.rllib.learner.forward_passes`);
* ref: ``CausalLMRLModule.reference_log_probs``;  adv: the rest of ``_prepare``;
* update: ``GRPOLearner._uncompiled_update`` (forward, backward, optimizer step);
* weight_sync: the algorithm's ``WeightSync.sync`` (``timing_s/update_weights``);
* the driver overhead is the rest of ``train()``; its parts come from probes on the
  sampling strategy's ``sample_now``, ``LearnerGroup.update`` and ``GRPO.training_step``.

The algorithm's own ``timing_s/*`` values are kept beside the probes' (``framework/...``;
``timing_s/sample`` is a moving average, not the last value).  Where the learner logs ``timing_s/old_log_prob``, ``timing_s/ref`` or
``timing_s/adv`` itself, those values are reported beside the probes'.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from benchmarks.common import (
    Timer,
    Workload,
    cpu_per_iteration,
    cpu_seconds,
    maybe_profiled,
    peak_memory_mb,
    token_counts,
)

logger = logging.getLogger(__name__)
FRAMEWORK_TIMINGS = ("sample", "update_actor", "update_weights", "step")
LEARNER_TIMINGS = ("old_log_prob", "ref", "adv")


class Probes:
    """Wraps functions so that each call adds its duration to a phase of a `Timer`."""

    def __init__(self, timer: Timer) -> None:
        self.timer = timer
        self.missing: list[str] = []
        self._undo: list[Callable[[], None]] = []

    def wrap(self, owner: Any, name: str, phase: str) -> None:
        """Time every call of ``owner.name`` (a class, instance or module attribute)."""
        original = getattr(owner, name, None)
        if original is None:
            self.missing.append(f"{getattr(owner, '__name__', owner)}.{name}")
            return
        timer = self.timer

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = timer.now()
            try:
                return original(*args, **kwargs)
            finally:
                timer.add(phase, timer.now() - start)

        is_own = name in getattr(owner, "__dict__", {})
        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original) if is_own
                          else delattr(owner, name))

    def install_learner(self) -> None:
        """Probes on the learner side (classes and module functions; before the build)."""
        from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
        from rllib_grpo.rllib.learner import forward_passes, learner, module

        self.wrap(forward_passes, "response_log_probs", "old_log_prob")
        self.wrap(module.CausalLMRLModule, "reference_log_probs", "ref")
        self.wrap(learner.GRPOLearner, "_prepare", "prepare")
        self.wrap(learner.GRPOLearner, "_uncompiled_update", "update")
        self.wrap(TextEnvRunner, "_score_many", "reward")

    def install_driver(self, algo: Any) -> None:
        """Probes on the built algorithm: sampler, sampling, update, weight sync, step."""
        self.wrap(algo.env_runner.sampler, "generate", "generation")
        self.wrap(algo.sampling, "sample_now", "sample")
        self.wrap(algo.learner_group, "update", "update_actor")
        self.wrap(algo._weight_sync, "sync", "update_weights")
        self.wrap(algo, "training_step", "step")

    def remove(self) -> None:
        for undo in reversed(self._undo):
            undo()
        self._undo.clear()


def use_old_weight_sync(algo: Any) -> None:
    """Experiment: RLlib's weight sync in place of the algorithm's ``WeightSync.sync``.

    RLlib's ``EnvRunnerGroup.sync_weights`` (which ``ray.put``s the whole state into the
    object store even with no remote env runner to read it) and a clone of every tensor
    in ``CausalLMRLModule.get_state``; see benchmarks/README.md.
    """
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.learner.module import CausalLMRLModule

    group, learner_group = algo.env_runner_group, algo.learner_group

    def sync() -> dict[str, float]:
        group.sync_weights(from_worker_or_learner_group=learner_group,
                           policies=[DEFAULT_MODULE_ID], inference_only=True)
        return {}

    algo._weight_sync.sync = sync
    original = CausalLMRLModule.get_state

    def get_state(self, *args: Any, **kwargs: Any) -> Any:
        state = original(self, *args, **kwargs)
        if kwargs.get("inference_only") and isinstance(state, dict):
            return {k: v.clone() if hasattr(v, "clone") else v for k, v in state.items()}
        return state

    CausalLMRLModule.get_state = get_state


def use_item_metrics() -> None:
    """Experiment: the driver logs its per-step values as RLlib ``item`` stats.

    ``GRPO._log_value`` and ``SamplingStrategy.log`` log ~45 values per step with
    ``reduce="mean", window=1``, i.e. a windowed mean (``np.nanmean``) of one value per key
    at every reduction; an ``item`` stat keeps the last value and needs no reduction.
    """
    from rllib_grpo.rllib.algorithm.grpo import GRPO
    from rllib_grpo.rllib.algorithm.sampling import SamplingStrategy

    def _log_value(self, key: str, value: float) -> None:
        self.metrics.log_value(key, float(value), reduce="item")

    GRPO._log_value = _log_value
    SamplingStrategy.log = _log_value


def build_config(w: Workload) -> Any:
    """The GRPOConfig of the workload: local learner and env runner, fixed sizes."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": w.max_operand})
        .training(
            model_path=w.model_dir, prompts_per_step=w.prompts, group_size=w.group_size,
            max_prompt_length=w.max_prompt_length, max_response_length=w.response_length,
            micro_batch_size_per_learner=w.micro_batch_size, use_kl_loss=w.kl, lr=w.lr,
            sampler=w.sampler, model_dtype=w.dtype, sampler_config=w.engine_options(),
            use_remove_padding=w.remove_padding, skip_old_log_prob_pass=not w.old_log_prob_pass,
        )
        .env_runners(num_env_runners=0)
        .debugging(seed=w.seed)
    )
    if w.device != "cpu":
        config.learners(num_learners=0, num_gpus_per_learner=1)
    return config


def init_ray(w: Workload) -> None:
    import ray

    # A Ray of its own even when another runs here (a test session, a `ray start`).
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 2),
             num_gpus=0 if w.device == "cpu" else 1,
             object_store_memory=(500 if w.device == "cpu" else 4000) * 1024**2,
             include_dashboard=False, log_to_driver=False, configure_logging=False)


def run_rllib(w: Workload) -> dict[str, Any]:
    """Build the algorithm, warm up, then time ``w.iterations`` calls of ``train()``."""
    import ray
    import torch

    torch.set_num_threads(w.threads)
    timer = Timer(w.device)
    start = time.perf_counter()
    init_ray(w)
    ray_init_s = time.perf_counter() - start
    if "item-metrics" in w.experiments:
        use_item_metrics()
    probes = Probes(timer)
    probes.install_learner()
    start = time.perf_counter()
    algo = build_config(w).build_algo()
    build_s = time.perf_counter() - start
    if "old-weight-sync" in w.experiments:
        use_old_weight_sync(algo)
    probes.install_driver(algo)
    torch.set_num_threads(w.threads)  # whatever the build did
    try:
        for _ in range(w.warmup):
            algo.train()
        cpu_before = cpu_seconds(include_children=True)
        with maybe_profiled(w.profile_dir, "rllib"):
            records = [_timed_train(algo, timer) for _ in range(w.iterations)]
        cpu = cpu_per_iteration(cpu_before, cpu_seconds(include_children=True), w.iterations)
        memory = {**peak_memory_mb(), "ray_processes_rss_mb": ray_processes_rss_mb()}
        params = _num_parameters(algo)
    finally:
        probes.remove()
        algo.stop()
        ray.shutdown()
    return {"records": records, "setup_s": ray_init_s + build_s, "ray_init_s": ray_init_s,
            "build_algo_s": build_s, "torch_threads": torch.get_num_threads(),
            "probes_missing": probes.missing, **params, **memory, **cpu}


def _timed_train(algo: Any, timer: Timer) -> dict[str, float]:
    timer.reset()
    start = timer.now()
    result = algo.train()
    wall = timer.now() - start
    return phase_record(result, timer, wall, algo.last_rollout)


def phase_record(result: dict, timer: Timer, wall: float, rollout: Any) -> dict[str, float]:
    """Per-phase seconds of one ``train()`` call, the overhead's parts, and token counts."""
    framework = {k: float(result.get(f"timing_s/{k}", 0.0)) for k in FRAMEWORK_TIMINGS}
    learner_logged = _learner_timings(result)
    probed = {k: timer.get(k) for k in FRAMEWORK_TIMINGS}
    record = {
        "generation": timer.get("generation"),
        "reward": timer.get("reward"),
        "old_log_prob": timer.get("old_log_prob"),
        "ref": timer.get("ref"),
        "adv": timer.get("prepare") - timer.get("old_log_prob") - timer.get("ref"),
        "update": timer.get("update"),
        "weight_sync": probed["update_weights"],
    }
    record["driver_overhead"] = wall - sum(record.values())
    record.update(
        sampling_other=probed["sample"] - record["generation"] - record["reward"],
        learner_other=probed["update_actor"] - timer.get("prepare") - record["update"],
        step_other=probed["step"] - probed["sample"] - probed["update_actor"]
        - probed["update_weights"],
        train_other=wall - probed["step"],
        iteration=wall,
    )
    record.update({f"framework/timing_s/{k}": v for k, v in framework.items()})
    record.update({f"learner/timing_s/{k}": v for k, v in learner_logged.items()})
    # Sampler and learner agree only if the weight sync worked (a check on experiments).
    record["rollout_log_probs_diff_max"] = float(
        result.get("training/rollout_log_probs_diff_max", float("nan")))
    record.update(token_counts(rollout.prompt_lengths, rollout.response_lengths,
                               rollout.prompt_ids.shape[1], rollout.response_ids.shape[1]))
    return record


def _learner_timings(result: dict) -> dict[str, float]:
    """``timing_s/old_log_prob``/``ref``/``adv`` where the learner logs them (optional):
    at the top level of the result or under ``learners/default_policy``."""
    learner = result.get("learners", {}).get("default_policy", {})
    found = {}
    for key in LEARNER_TIMINGS:
        name = f"timing_s/{key}"
        value = result.get(name, learner.get(name))
        if value is not None:
            found[key] = float(value)
    return found


def _num_parameters(algo: Any) -> dict[str, int]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    lm = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped().lm
    return {"params": lm.num_parameters(),
            "non_embedding_params": lm.num_parameters(exclude_embeddings=True)}


def ray_processes_rss_mb() -> float:
    """RSS of the processes Ray started beside the driver (GCS, raylet, workers), MiB."""
    import psutil

    total = 0
    for child in psutil.Process().children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            continue
    return total / 2**20
