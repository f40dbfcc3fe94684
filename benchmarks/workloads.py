"""The benchmark models and the fixed-length copy every benchmark samples from.

* ``builtin:10m``: a ~10M-parameter llama over the character tokenizer (hidden 256,
  10 layers, 8 heads of 32, 4 KV heads, MLP 1024), randomly initialised;
* ``builtin:qwen2-5m7``: a 5.71M-parameter Qwen2 (``qwen2`` model type, with its q/k/v
  biases) over the character tokenizer (hidden 256, 8 layers, 4 heads of 64, 2 KV heads,
  MLP 672), randomly initialised: the small model of `benchmarks.trl`;
* ``builtin:qwen05b-shape``: a randomly initialised model with the shapes of
  Qwen2.5-0.5B (hidden 896, 24 layers, 14 heads of 64, 2 KV heads, MLP 4864,
  vocabulary 151,936, tied embeddings) for GPU runs.  It uses the ``llama`` model
  type (the ``qwen2`` type triggers the tokenizer trap of `rllib_grpo.models`), so
  it lacks Qwen2's q/k/v biases (0.03% of the parameters); the compute is otherwise
  the same;
* `fixed_length_copy`: a copy of a model folder with no end-of-sequence token
  (weights linked, configs rewritten), so that every response runs to
  ``max_response_length`` and every iteration does the same work.

``builtin:tiny`` and ``smollm2-135m`` are registered by `rllib_grpo.models`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from rllib_grpo.models import (
    DEFAULT_ALPHABET,
    ModelAndTokenizer,
    build_char_tokenizer,
    build_tiny_causal_lm,
    default_cache_dir,
    register_builtin_model,
    resolve_model,
)

MODEL_10M = "builtin:10m"
MODEL_QWEN05B = "builtin:qwen05b-shape"
MODEL_QWEN2_5M7 = "builtin:qwen2-5m7"
PARAMS_10M: dict[str, Any] = {
    "version": 1, "alphabet": DEFAULT_ALPHABET, "seed": 0, "arch": "llama", "hidden_size": 256,
    "num_layers": 10, "num_heads": 8, "num_kv_heads": 4, "intermediate_size": 1024,
    "max_position_embeddings": 512,
}
PARAMS_QWEN2_5M7: dict[str, Any] = {
    "version": 1, "alphabet": DEFAULT_ALPHABET, "seed": 0, "arch": "qwen2", "hidden_size": 256,
    "num_layers": 8, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 672,
    "max_position_embeddings": 512,
}
PARAMS_QWEN05B: dict[str, Any] = {
    "version": 1, "seed": 0, "vocab_size": 151_936, "hidden_size": 896, "num_layers": 24,
    "num_heads": 14, "num_kv_heads": 2, "intermediate_size": 4864,
    "max_position_embeddings": 4096, "rope_theta": 1_000_000.0, "save_dtype": "bfloat16",
}
# The JSON fields that name the end-of-sequence token, per file of a model folder.
EOS_FIELDS = {
    "config.json": ("eos_token_id",),
    "generation_config.json": ("eos_token_id",),
    "tokenizer_config.json": ("eos_token",),
    "special_tokens_map.json": ("eos_token",),
}
SURROGATES = range(0xD800, 0xE000)


def _build_char_model(*, alphabet: str, seed: int, version: int, **model_kwargs: Any) -> ModelAndTokenizer:
    """A character-level model: the ~10M llama or the 5.7M Qwen2 (``version`` only keys the
    cache)."""
    tokenizer = build_char_tokenizer(alphabet)
    return build_tiny_causal_lm(tokenizer, seed=seed, **model_kwargs), tokenizer


def wide_alphabet(size: int) -> str:
    """The arithmetic alphabet followed by other code points, ``size`` characters in all."""
    chars = list(DEFAULT_ALPHABET)
    code = 0x100
    while len(chars) < size:
        if code not in SURROGATES:
            chars.append(chr(code))
        code += 1
    return "".join(chars)


def _build_qwen05b_shape(
    *, vocab_size: int, seed: int, save_dtype: str, version: int, num_layers: int,
    num_heads: int, num_kv_heads: int, rope_theta: float, **shape: Any,
) -> ModelAndTokenizer:
    """A random model shaped like Qwen2.5-0.5B, over a character tokenizer of its vocabulary."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_char_tokenizer(wide_alphabet(vocab_size - 4))
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        rope_theta=rope_theta, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **shape,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return model.to(getattr(torch, save_dtype)).eval(), tokenizer


def register_benchmark_models() -> None:
    """Register ``builtin:10m``, ``builtin:qwen2-5m7`` and ``builtin:qwen05b-shape``
    (idempotent)."""
    register_builtin_model(MODEL_10M, _build_char_model, params=PARAMS_10M)
    register_builtin_model(MODEL_QWEN2_5M7, _build_char_model, params=PARAMS_QWEN2_5M7)
    register_builtin_model(MODEL_QWEN05B, _build_qwen05b_shape, params=PARAMS_QWEN05B)


def fixed_length_copy(model_dir: str, cache_dir: str | os.PathLike | None = None) -> str:
    """A folder like ``model_dir`` but without an end-of-sequence token (built once, cached).

    Files are symlinked except the JSON configs that name EOS, which are rewritten
    with it set to null: the transformers and vLLM samplers then stop only at
    ``max_tokens``.  The token itself stays in the vocabulary as an ordinary one.
    """
    source = Path(model_dir).resolve()
    digest = hashlib.sha256(str(source).encode()).hexdigest()[:10]
    target = Path(cache_dir or default_cache_dir()) / f"{source.name}-noeos-{digest}"
    if target.is_dir():
        return str(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        for item in source.iterdir():
            _copy_without_eos(item, scratch / item.name)
        os.rename(scratch, target)
    except OSError:
        if not target.is_dir():  # a lost race leaves the winner's folder: fine
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


def _copy_without_eos(source: Path, target: Path) -> None:
    if source.name not in EOS_FIELDS:
        os.symlink(source, target)
        return
    data = json.loads(source.read_text())
    for section in (data, data.get("text_config") or {}):
        for key in EOS_FIELDS[source.name]:
            if key in section:
                section[key] = None
    target.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def prepare_model(name_or_path: str, fixed_length: bool = True) -> str:
    """Resolve a model name to a folder (building built-ins), optionally without EOS."""
    register_benchmark_models()
    folder = resolve_model(name_or_path)
    if not Path(folder).is_dir():
        raise FileNotFoundError(
            f"{name_or_path!r} is not a local folder or a built-in model; the benchmark "
            "works offline and needs one of those")
    return fixed_length_copy(folder) if fixed_length else folder
