"""Samplers: generate groups of responses with their sampling log-probs.

``make_sampler("auto", ...)`` gives the vLLM sampler where vLLM imports and
the transformers one otherwise.  Importing this package imports neither vLLM
nor transformers; they load when a sampler is made.
"""

from __future__ import annotations

import logging
from typing import Any

from rllib_grpo.samplers.base import Sample, Sampler, SamplingParams

__all__ = ["Sample", "Sampler", "SamplingParams", "make_sampler", "SAMPLER_KINDS", "HF_OPTIONS"]

logger = logging.getLogger(__name__)

SAMPLER_KINDS = ("auto", "vllm", "hf")
# Options the transformers sampler understands beyond the common ones.
HF_OPTIONS = frozenset({"device", "max_batch_size", "config_overrides"})


def make_sampler(
    kind: str = "auto",
    *,
    model_path: str,
    tokenizer_path: str | None = None,
    dtype: str = "float32",
    seed: int = 0,
    **engine_kwargs: Any,
) -> Sampler:
    """Build a sampler of ``kind`` (``"auto"``, ``"vllm"`` or ``"hf"``) for a model folder.

    ``"auto"`` tries vLLM and falls back to transformers with one warning that
    says why; vLLM-only ``engine_kwargs`` are then dropped.
    """
    if kind not in SAMPLER_KINDS:
        raise ValueError(f"sampler kind must be one of {SAMPLER_KINDS}, got {kind!r}")
    common: dict[str, Any] = {"tokenizer_path": tokenizer_path, "dtype": dtype, "seed": seed}
    if kind in ("auto", "vllm"):
        try:
            from rllib_grpo.samplers.vllm import VLLMSampler

            return VLLMSampler(model_path, **common, **engine_kwargs)
        except ImportError as error:  # vLLM missing or built for another torch
            if kind == "vllm":
                raise
            logger.warning("vLLM does not import (%s): sampling with transformers", error)
            if "hf_overrides" in engine_kwargs:  # vLLM's name for HF config overrides
                engine_kwargs["config_overrides"] = engine_kwargs.pop("hf_overrides")
            engine_kwargs = {k: v for k, v in engine_kwargs.items() if k in HF_OPTIONS}
    from rllib_grpo.samplers.hf import HFSampler

    return HFSampler(model_path, **common, **engine_kwargs)
