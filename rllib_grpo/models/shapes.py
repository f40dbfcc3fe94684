"""The shape of a causal LM without its weights: what the memory plan
(`rllib_grpo.rllib.config.memory`) needs, read from a config.json or from a built-in table.

`model_shape` looks, in order, at a built-in model's or a local folder's ``config.json``, at
a hub id's ``config.json`` in the local Hugging Face cache, and at `KNOWN_SHAPES`: the
shapes of the popular dense families (Qwen2.5 0.5B-72B, Qwen3 0.6B-32B, Llama-3 1B-70B),
each copied from its model's published ``config.json`` (the entry's ``source``), so that a
plan for ``Qwen/Qwen3-8B`` needs neither the network nor the weights.  Parameters are
counted on the meta device (nothing is allocated), by transformers' own modules.  No Ray
here.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path
from typing import Any

import torch

_HUB = "https://huggingface.co/{}/blob/main/config.json"


def _known(hub_id: str, model_type: str, *, hidden: int, layers: int, heads: int,
           kv_heads: int, intermediate: int, vocab: int, tied: bool,
           head_dim: int | None = None) -> tuple[str, dict[str, Any]]:
    config = {"model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "intermediate_size": intermediate, "vocab_size": vocab,
              "tie_word_embeddings": tied, "source": _HUB.format(hub_id)}
    if head_dim is not None:
        config["head_dim"] = head_dim
    return hub_id, config


# The config.json fields that set a dense model's parameter count and memory, by hub id
# (instruct and base variants share them).  Each entry's ``source`` is where it was read.
KNOWN_SHAPES: dict[str, dict[str, Any]] = dict([
    _known("Qwen/Qwen2.5-0.5B", "qwen2", hidden=896, layers=24, heads=14, kv_heads=2,
           intermediate=4864, vocab=151936, tied=True),
    _known("Qwen/Qwen2.5-1.5B", "qwen2", hidden=1536, layers=28, heads=12, kv_heads=2,
           intermediate=8960, vocab=151936, tied=True),
    _known("Qwen/Qwen2.5-3B", "qwen2", hidden=2048, layers=36, heads=16, kv_heads=2,
           intermediate=11008, vocab=151936, tied=True),
    _known("Qwen/Qwen2.5-7B", "qwen2", hidden=3584, layers=28, heads=28, kv_heads=4,
           intermediate=18944, vocab=152064, tied=False),
    _known("Qwen/Qwen2.5-14B", "qwen2", hidden=5120, layers=48, heads=40, kv_heads=8,
           intermediate=13824, vocab=152064, tied=False),
    _known("Qwen/Qwen2.5-32B", "qwen2", hidden=5120, layers=64, heads=40, kv_heads=8,
           intermediate=27648, vocab=152064, tied=False),
    _known("Qwen/Qwen2.5-72B", "qwen2", hidden=8192, layers=80, heads=64, kv_heads=8,
           intermediate=29568, vocab=152064, tied=False),
    _known("Qwen/Qwen3-0.6B", "qwen3", hidden=1024, layers=28, heads=16, kv_heads=8,
           head_dim=128, intermediate=3072, vocab=151936, tied=True),
    _known("Qwen/Qwen3-1.7B", "qwen3", hidden=2048, layers=28, heads=16, kv_heads=8,
           head_dim=128, intermediate=6144, vocab=151936, tied=True),
    _known("Qwen/Qwen3-4B", "qwen3", hidden=2560, layers=36, heads=32, kv_heads=8,
           head_dim=128, intermediate=9728, vocab=151936, tied=True),
    _known("Qwen/Qwen3-8B", "qwen3", hidden=4096, layers=36, heads=32, kv_heads=8,
           head_dim=128, intermediate=12288, vocab=151936, tied=False),
    _known("Qwen/Qwen3-14B", "qwen3", hidden=5120, layers=40, heads=40, kv_heads=8,
           head_dim=128, intermediate=17408, vocab=151936, tied=False),
    _known("Qwen/Qwen3-32B", "qwen3", hidden=5120, layers=64, heads=64, kv_heads=8,
           head_dim=128, intermediate=25600, vocab=151936, tied=False),
    _known("meta-llama/Meta-Llama-3-8B", "llama", hidden=4096, layers=32, heads=32,
           kv_heads=8, intermediate=14336, vocab=128256, tied=False),
    _known("meta-llama/Meta-Llama-3-70B", "llama", hidden=8192, layers=80, heads=64,
           kv_heads=8, intermediate=28672, vocab=128256, tied=False),
    _known("meta-llama/Llama-3.1-8B", "llama", hidden=4096, layers=32, heads=32, kv_heads=8,
           intermediate=14336, vocab=128256, tied=False),
    _known("meta-llama/Llama-3.1-70B", "llama", hidden=8192, layers=80, heads=64, kv_heads=8,
           intermediate=28672, vocab=128256, tied=False),
    _known("meta-llama/Llama-3.2-1B", "llama", hidden=2048, layers=16, heads=32, kv_heads=8,
           head_dim=64, intermediate=8192, vocab=128256, tied=True),
    _known("meta-llama/Llama-3.2-3B", "llama", hidden=3072, layers=28, heads=24, kv_heads=8,
           head_dim=128, intermediate=8192, vocab=128256, tied=True),
    _known("meta-llama/Llama-3.3-70B-Instruct", "llama", hidden=8192, layers=80, heads=64,
           kv_heads=8, intermediate=28672, vocab=128256, tied=False),
])
# Name endings that keep a model's shape (an instruction-tuned or base release).
_VARIANT_SUFFIX = re.compile(r"-(instruct|base|chat|it)$")


def _table_key(name: str) -> str:
    """``"Qwen/Qwen3-8B-Base"`` and ``"/models/Qwen3-8B"`` -> ``"qwen3-8b"``;
    ``"meta-llama/Meta-Llama-3-8B-Instruct"`` -> ``"llama-3-8b"``."""
    key = name.rstrip("/").rsplit("/", 1)[-1].lower()
    key = key.removeprefix("meta-")
    return _VARIANT_SUFFIX.sub("", key)


_TABLE_BY_KEY = {_table_key(hub_id): hub_id for hub_id in KNOWN_SHAPES}


def known_shape(name: str) -> tuple[str, dict[str, Any]] | None:
    """``(hub id, config fields)`` of the `KNOWN_SHAPES` entry ``name`` names (a hub id or
    a folder named like one, any organisation, an ``-Instruct``/``-Base`` variant), or None."""
    hub_id = _TABLE_BY_KEY.get(_table_key(name))
    return (hub_id, KNOWN_SHAPES[hub_id]) if hub_id else None


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """What the memory plan needs of a causal LM: parameter counts (the whole model, one
    decoder layer on average, the largest single tensor, the trainable adapter) and the
    dimensions activations, logits and KV caches scale with.  ``source``: where the shape
    was read."""

    num_params: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    layer_params: float
    largest_tensor: int
    qk_norm: bool = False
    lora_params: int = 0
    model_type: str = "llama"
    source: str = ""

    @property
    def q_width(self) -> int:
        """Features of a token's queries (heads x head_dim)."""
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Features of a token's keys (= its values): KV heads x head_dim."""
        return self.num_kv_heads * self.head_dim


def model_shape(name_or_path: str, lora_rank: int = 0,
                target_modules: str | list[str] | tuple[str, ...] = "all-linear") -> ModelShape:
    """The shape of ``name_or_path`` (a built-in name, a folder, a hub id) and of a LoRA
    adapter of ``lora_rank`` on ``target_modules`` (module docstring for where it is read).
    Raises ValueError naming the places looked at when none has it."""
    targets = target_modules if isinstance(target_modules, str) else tuple(target_modules)
    return _model_shape(name_or_path, lora_rank, targets)


@functools.lru_cache(maxsize=64)
def _model_shape(name_or_path: str, lora_rank: int, targets: str | tuple[str, ...]
                 ) -> ModelShape:
    config, source = _config_of(name_or_path)
    return _shape_of(config, source, lora_rank, targets)


def _config_of(name_or_path: str) -> tuple[Any, str]:
    from transformers import AutoConfig

    from rllib_grpo.models.model_registry import builtin_model_names, resolve_model

    folder = Path(name_or_path).expanduser()
    if not (folder / "config.json").is_file() and name_or_path in builtin_model_names():
        folder = Path(resolve_model(name_or_path))
    if (folder / "config.json").is_file():
        return AutoConfig.from_pretrained(str(folder), local_files_only=True), \
            f"{folder.name}/config.json"
    try:
        return AutoConfig.from_pretrained(name_or_path, local_files_only=True), \
            f"{name_or_path}'s config.json in the local Hugging Face cache"
    except (OSError, ValueError):
        pass
    known = known_shape(name_or_path)
    if known is None:
        raise ValueError(
            f"no shape for {name_or_path!r}: not a local folder with config.json, not in the "
            "local Hugging Face cache, and not in the built-in table of shapes "
            "(rllib_grpo.models.shapes.KNOWN_SHAPES: " + ", ".join(KNOWN_SHAPES) + ")")
    hub_id, fields = known
    fields = dict(fields)
    source = fields.pop("source")
    return AutoConfig.for_model(**fields), f"built-in table ({hub_id}: {source})"


def _shape_of(config: Any, source: str, lora_rank: int, targets: str | tuple[str, ...]
              ) -> ModelShape:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    text = config.get_text_config()
    vision = getattr(config, "vision_config", None) is not None  # its tower counts too
    with torch.device("meta"):
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(
            config)
    named = dict(model.named_parameters())  # shared (tied) tensors once
    in_layers = sum(p.numel() for name, p in named.items()
                    if ".layers." in name and not any(v in name for v in ("visual", "vision")))
    heads = text.num_attention_heads
    qk_norm = any(name.endswith(("q_norm.weight", "k_norm.weight")) for name in named)
    return ModelShape(
        num_params=sum(p.numel() for p in named.values()),
        hidden_size=text.hidden_size, num_layers=text.num_hidden_layers,
        vocab_size=text.vocab_size, num_heads=heads,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        intermediate_size=text.intermediate_size,
        layer_params=in_layers / max(text.num_hidden_layers, 1),
        largest_tensor=max(p.numel() for p in named.values()),
        qk_norm=qk_norm, lora_params=lora_param_count(model, lora_rank, targets),
        model_type=str(text.model_type), source=source,
    )


def lora_param_count(model: torch.nn.Module, rank: int,
                     target_modules: str | tuple[str, ...]) -> int:
    """``rank x (in + out)`` over the linear layers peft would adapt."""
    if rank <= 0:
        return 0
    head = model.get_output_embeddings()  # type: ignore[operator]
    names = None if target_modules == "all-linear" else (
        {target_modules} if isinstance(target_modules, str) else set(target_modules))
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        if names is None or name.rpartition(".")[2] in names or name in names:
            total += rank * (module.in_features + module.out_features)
    return total
