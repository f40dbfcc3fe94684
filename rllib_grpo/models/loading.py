"""Build, save and load causal LMs (no Ray): the tiny random model, model folders, dtypes."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from rllib_grpo.models.tokenizers import (
    _name_generic_tokenizer_class,
    _special_token_ids,
    _warn_if_auto_tokenizer_differs,
)

logger = logging.getLogger(__name__)

# Attention head sizes the vLLM CPU backend accepts (others crash at the first step).
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

# A built-in model's parts: the model, its tokenizer and, for a vision-language model, its
# image processor (saved beside them: `save_model_dir`).
ModelAndTokenizer = tuple[PreTrainedModel, PreTrainedTokenizerBase] | tuple[
    PreTrainedModel, PreTrainedTokenizerBase, Any]
BuiltinBuilder = Callable[..., ModelAndTokenizer]


def build_tiny_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 128,
    seed: int = 0,
    arch: str = "llama",
    tie_word_embeddings: bool = True,
) -> PreTrainedModel:
    """A randomly initialised fp32 causal LM sized for ``tokenizer``.

    ``arch`` is a transformers model type (``"llama"``, ``"qwen2"``, ...).  The
    default ``llama`` avoids the ``qwen2`` tokenizer trap (module docstring).
    The same ``seed`` gives the same weights; the global torch RNG is left as
    it was.
    """
    head_dim = hidden_size // num_heads
    if head_dim not in VLLM_HEAD_SIZES:
        logger.warning("head size %d is not one vLLM accepts %s", head_dim, VLLM_HEAD_SIZES)
    special_ids = _special_token_ids(tokenizer)
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for key, value in special_ids.items():
        setattr(model.generation_config, key, value)
    return model.eval()



def save_model_dir(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike,
    image_processor: Any = None,
) -> str:
    """Write ``model`` and ``tokenizer`` (and a vision-language model's ``image_processor``)
    to ``path`` for transformers and vLLM.

    Raises if the tokenizer has more tokens than the model's embedding rows.
    Warns when ``AutoTokenizer.from_pretrained(path)`` would not give back the
    same tokenizer (the ``qwen2`` trap); ``load_tokenizer`` still does.
    """
    path = str(path)
    vocab_size = model.config.get_text_config().vocab_size
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, model vocab is {vocab_size}")
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    if image_processor is not None:
        image_processor.save_pretrained(path)
    _name_generic_tokenizer_class(path)
    _warn_if_auto_tokenizer_differs(tokenizer, path)
    return path



def torch_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """``"float32"``/``"bfloat16"``/``"float16"`` -> torch dtype; ``"auto"`` stays."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {[*DTYPES, 'auto']}, got {dtype!r}") from None


def load_causal_lm(
    path: str, *, dtype: str | torch.dtype = "float32", gradient_checkpointing: bool = False,
    config_overrides: dict | None = None, on_meta: bool = False,
) -> PreTrainedModel:

    """Load a causal LM from a folder (or hub id) in ``dtype``, in eval mode: a
    vision-language model (its config has a ``vision_config``) as transformers' image-text
    model, whose forward also takes the images.

    ``config_overrides`` replace entries of the model's config (verl
    ``model.override_config``, e.g. ``max_position_embeddings``).  ``on_meta``: the
    model's structure alone, on the meta device (no weight is read or allocated): an FSDP
    rank whose shards are filled from another rank's weights (`rllib_grpo.rllib.learner.fsdp`).
    """
    config = AutoConfig.from_pretrained(path, **dict(config_overrides or {}))
    vision = getattr(config, "vision_config", None) is not None
    auto_class = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    if on_meta:
        with torch.device("meta"):
            model = auto_class.from_config(config, dtype=torch_dtype(dtype))
    else:
        model = auto_class.from_pretrained(path, dtype=torch_dtype(dtype),
                                           **dict(config_overrides or {}))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False  # the KV cache is useless while checkpointing
    return model.eval()


