"""The sampler options of an env runner, from its GRPO config: what the engine may take of
the GPU, how long a sequence it plans for, whether it sleeps and whether requests are seeded.
"""

from __future__ import annotations

from typing import Any

from rllib_grpo.rllib.config.layout import COLOCATED_MEMORY_FRACTION
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
    return options
