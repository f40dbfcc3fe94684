"""The sampler options of an env runner, from its GRPO config: what the engine may take of
the GPU, how long a sequence it plans for, whether it sleeps and whether requests are seeded.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from rllib_grpo.rllib.config.layout import (
    COLOCATED_MEMORY_FRACTION,
    colocated_engine_devices,
    engine_picks_devices,
    tensor_parallel_size,
)
from rllib_grpo.rllib.config.memory import sequences_at_once
from rllib_grpo.samplers.vllm_engine import context_length

# Of a fractional GPU reserved from Ray, what vLLM may take (CUDA context and allocator slack).
FRACTIONAL_GPU_SAFETY = 0.9


def engine_options(config: Any, model_path: str | None = None) -> dict[str, Any]:
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

    and HF config overrides (``model_override_config``) as vLLM's ``hf_overrides`` or the
    transformers sampler's ``config_overrides``.  (``sampler="auto"`` falling back to
    transformers drops the vLLM-only ones.)"""
    options = dict(config.sampler_config)
    options.pop("dtype", None)  # the sampler's dtype is config.sampler_dtype
    overrides = dict(config.model_override_config)
    if overrides:
        options["config_overrides" if config.sampler == "hf" else "hf_overrides"] = overrides
    if config.sampler == "hf":
        return options
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
    return options


def engine_environment(config: Any, worker_index: int,
                       node_gpus: Callable[[], Sequence[str]]) -> dict[str, str]:
    """The environment an env runner sets before its engine starts: for a colocated vLLM
    engine of tensor parallel ``t > 1`` (`layout.engine_picks_devices`), the ``t`` GPUs of
    its node it drives (`layout.colocated_engine_devices`) as ``CUDA_VISIBLE_DEVICES``,
    which vLLM's ``t`` worker processes inherit; Ray gave the env runner only one.  Empty
    otherwise (Ray's assignment is the engine's).  ``node_gpus`` lists the node's GPU ids
    (`rllib_grpo.rllib.placement.node_gpu_ids`), asked only when needed."""
    if not engine_picks_devices(config):
        return {}
    devices = colocated_engine_devices(node_gpus(), worker_index, tensor_parallel_size(config))
    return {"CUDA_VISIBLE_DEVICES": ",".join(devices)}


def place_engine(config: Any, worker_index: int,
                 node_gpus: Callable[[], Sequence[str]]) -> dict[str, str]:
    """Set `engine_environment` in this process (before the engine starts); returns it."""
    environment = engine_environment(config, worker_index, node_gpus)
    os.environ.update(environment)
    return environment
