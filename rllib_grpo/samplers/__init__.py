"""Samplers: generate groups of responses with their sampling log-probs.

``make_sampler("auto", ...)`` gives the vLLM sampler where vLLM is installed and
the transformers one otherwise.  Importing this package imports neither vLLM
nor transformers; they load when a sampler is made.
"""

from __future__ import annotations

import importlib.util
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

    ``"auto"`` is vLLM where vLLM is installed (and, for a vision-language model, can run
    it: `rllib_grpo.samplers.vllm_vision`), else transformers with one warning (vLLM-only
    ``engine_kwargs`` are then dropped).  An installed vLLM that does not
    import, or is older than the package needs, raises its error rather than leaving
    the run to transformers unasked.
    """
    if kind not in SAMPLER_KINDS:
        raise ValueError(f"sampler kind must be one of {SAMPLER_KINDS}, got {kind!r}")
    common: dict[str, Any] = {"tokenizer_path": tokenizer_path, "dtype": dtype, "seed": seed}
    vision_error = None
    if kind == "auto" and importlib.util.find_spec("vllm") is not None:
        from rllib_grpo.samplers.vllm_vision import vllm_vision_error

        vision_error = vllm_vision_error(model_path)
    if kind == "vllm" or (kind == "auto" and importlib.util.find_spec("vllm") is not None
                          and vision_error is None):
        from rllib_grpo.samplers.vllm import VLLMSampler

        return VLLMSampler(model_path, **common, **engine_kwargs)
    if kind == "auto":
        if vision_error is not None:
            logger.warning("%s; sampling with transformers", vision_error)
        else:
            logger.warning("vLLM is not installed: sampling with transformers "
                           "(pip install 'rllib-grpo[vllm]' for vLLM)")
        if "hf_overrides" in engine_kwargs:  # vLLM's name for HF config overrides
            engine_kwargs["config_overrides"] = engine_kwargs.pop("hf_overrides")
        engine_kwargs = {k: v for k, v in engine_kwargs.items() if k in HF_OPTIONS}
    from rllib_grpo.samplers.hf import HFSampler

    return HFSampler(model_path, **common, **engine_kwargs)
