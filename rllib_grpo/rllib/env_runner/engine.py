"""The sampler an env runner makes, from its GRPO config: which kind (vLLM, transformers),
what the engine may take of the GPU, how long a sequence it plans for, whether it sleeps and
whether requests are seeded; and where its engine's TP shards run.
"""

from __future__ import annotations

import os
from typing import Any

import ray

from rllib_grpo.rllib.config.gpu_layout import (
    COLOCATED_MEMORY_FRACTION,
    FRACTIONAL_GPU_SAFETY,
    planned_transports,
)
from rllib_grpo.rllib.config.memory import sequences_at_once
from rllib_grpo.rllib.placement import BUNDLES_VARIABLE, fake_gpus, whereabouts
from rllib_grpo.samplers import HF_OPTIONS
from rllib_grpo.samplers.vllm_engine import context_length
from rllib_grpo.weights.plan import VLLM_ENGINES


def sampler_kind(config: Any) -> str:
    """The sampler an env runner makes: the config's, but the transformers sampler on the
    CPU where the GPUs are fake (vLLM cannot run on a GPU that is not there)."""
    return "hf" if fake_gpus() and config.sampler != "hf" else config.sampler


def engine_options(config: Any, model_path: str | None = None, kind: str | None = None,
                   worker_index: int | None = None) -> dict[str, Any]:
    """Sampler options: ``sampler_config``, plus for a vLLM engine

    * ``gpu_memory_utilization``: ``sampler_memory_fraction``, else ``sampler_config``'s,
      else `COLOCATED_MEMORY_FRACTION` when it shares the learner's GPU, else
      `FRACTIONAL_GPU_SAFETY` x the GPU fraction this env runner reserved from Ray, else
      vLLM's default (a whole GPU);
    * ``max_model_len``: the prompt + response budget (a multi-turn episode's too: its
      responses and observations share ``max_response_length``), capped by the model's
      context when ``model_path`` is its folder;
    * ``enable_sleep_mode`` where the engine sleeps during the update (``sampler_sleeps``);
    * ``seed_requests``: only when the config has a seed (reproducibility asked);
    * ``cpu_max_num_seqs``: on CPU, the sequences this runner holds at once
      (`sequences_at_once`), vLLM's ``max_num_seqs`` unless ``sampler_config`` sets it,
      which sizes the CPU engine's KV cache;
    * ``weight_transfer_backend``: for env runner ``worker_index``, vLLM's weight-transfer
      engine its weight syncs take (`weight_transfer_backend`);

    and HF config overrides (``model_override_config``) as vLLM's ``hf_overrides`` or the
    transformers sampler's ``config_overrides``.  (``sampler="auto"`` falling back to
    transformers drops the vLLM-only ones.)  ``kind``: the sampler made (`sampler_kind`;
    None: the config's); a transformers sampler standing in for vLLM keeps the options it
    knows."""
    kind = kind or config.sampler
    options = dict(config.sampler_config)
    options.pop("dtype", None)  # the sampler's dtype is config.sampler_dtype
    overrides = dict(config.model_override_config)
    if overrides:
        options["config_overrides" if kind == "hf" else "hf_overrides"] = overrides
    if kind == "hf":
        return (options if config.sampler == "hf"
                else {k: v for k, v in options.items() if k in HF_OPTIONS})
    if config.sampler_memory_fraction is not None:
        options["gpu_memory_utilization"] = config.sampler_memory_fraction
    gpus = config.num_gpus_per_env_runner
    if config.sampler_sleeps:
        options.setdefault("gpu_memory_utilization", COLOCATED_MEMORY_FRACTION)
        options["enable_sleep_mode"] = True
    elif 0 < gpus < 1:
        options.setdefault("gpu_memory_utilization", round(FRACTIONAL_GPU_SAFETY * gpus, 3))
    budget = config.max_prompt_length + config.max_response_length
    context = context_length(model_path, overrides) if model_path else None
    options.setdefault("max_model_len", min(budget, context) if context else budget)
    options.setdefault("seed_requests", config.seed is not None)
    options.setdefault("cpu_max_num_seqs", sequences_at_once(config))
    backend = None if worker_index is None else weight_transfer_backend(config, worker_index)
    if backend is not None:
        options.setdefault("weight_transfer_backend", backend)
    return options


def weight_transfer_backend(config: Any, worker_index: int) -> str | None:
    """vLLM's weight-transfer engine (``ipc``, ``nccl``) that env runner ``worker_index``'s
    engine is started with: the one the weight sync's planner picks for where the placement
    plan puts it (`planned_transports`; the run checks it where the runner landed).  None
    for the paths without one, and for a setting the config's checks refuse."""
    try:
        transport = planned_transports(config, config.placement_plan()).get(worker_index)
    except ValueError:
        return None
    return VLLM_ENGINES.get(transport or "")


def engine_whereabouts(sampler: Any, shards: list[Any]) -> list[dict[str, Any]]:
    """Where each TP shard of an env runner's engine runs: the stand-ins', a real vLLM
    engine's Ray workers', or this process (an engine of TP 1 runs in it)."""
    if shards:
        return ray.get([s.whereabouts.remote() for s in shards])
    llm = getattr(sampler, "llm", None)
    if llm is not None and os.environ.get(BUNDLES_VARIABLE):
        return list(llm.collective_rpc(_worker_whereabouts))
    return [whereabouts()]


def _worker_whereabouts(_worker: Any) -> dict[str, Any]:
    return whereabouts()
