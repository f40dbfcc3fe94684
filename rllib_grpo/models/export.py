"""Write a policy's weights as a standard Hugging Face model folder (no Ray).

A learner's module state is either a full HF state dict (every parameter by its
HF name, gathered from all FSDP shards) or, with LoRA, an adapter checkpoint
(`rllib_grpo.models.lora.adapter_checkpoint`: the adapter plus a note of the
base model).  `export_module_state` turns either into a folder that
``AutoModelForCausalLM.from_pretrained``, vLLM and the Hub tooling read:

* ``config.json`` and ``generation_config.json`` of the base model, with the
  exported dtype;
* safetensors shards (``model.safetensors`` or ``model-0000k-of-0000n.safetensors``
  plus ``model.safetensors.index.json``), written by transformers' own
  ``save_pretrained``, so tied embeddings are stored once as usual;
* the base model's tokenizer files, chat template included, copied unchanged;
* for ``lora="adapter"`` instead of weights: PEFT's ``adapter_config.json`` and
  ``adapter_model.safetensors`` (``PeftModel.from_pretrained(base, folder)`` or
  ``AutoPeftModelForCausalLM.from_pretrained(folder)`` load it).

A LoRA adapter is merged as the samplers merge it (`rllib_grpo.models.lora.merge`:
``W + (B @ A) * alpha / r`` in float32) onto the base weights loaded in the
learner's dtype.  The folder is written to a scratch folder beside ``out_dir`` and
renamed into place, so a failed export leaves no half-written model.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rllib_grpo.models import lora
from rllib_grpo.models.loading import load_causal_lm, torch_dtype
from rllib_grpo.models.model_registry import resolve_model

logger = logging.getLogger(__name__)

LORA_EXPORT_MODES = ("merge", "adapter")
# What a tokenizer folder may hold (the chat template is in tokenizer_config.json or its own file).
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "vocab.txt",
    "tokenizer.model", "spiece.model",
)
DEFAULT_MAX_SHARD_SIZE = "5GB"


@dataclass
class ExportedModel:
    """What `export_module_state` wrote.

    ``kind``: ``"full"`` (a full state dict), ``"merged-lora"`` (adapter merged into
    the base) or ``"lora-adapter"`` (a PEFT adapter folder).
    """

    path: str
    kind: str
    dtype: str
    base_model: str
    files: list[str] = field(default_factory=list)

    def describe(self) -> str:
        """One line for a terminal."""
        what = {"full": "model", "merged-lora": "model (LoRA merged)",
                "lora-adapter": "PEFT LoRA adapter"}[self.kind]
        return (f"{what}, {self.dtype}, {len(self.files)} files, base {self.base_model}: "
                f"{self.path}")


def stored_dtype(state_dict: Mapping[str, torch.Tensor]) -> str:
    """The dtype name (``"float32"``, ``"bfloat16"``, ...) of a state dict's floating tensors."""
    dtypes = {t.dtype for t in state_dict.values() if torch.is_tensor(t) and t.is_floating_point()}
    if len(dtypes) != 1:
        found = sorted(str(d) for d in dtypes) or "none"
        raise ValueError(f"the weights hold floating dtypes {found}: pass dtype= explicitly")
    return str(dtypes.pop()).removeprefix("torch.")


def export_module_state(
    module_state: Mapping[str, Any],
    base_model: str,
    out_dir: str | os.PathLike,
    *,
    dtype: str | None = None,
    lora_mode: str = "merge",
    base_dtype: str = "float32",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
) -> ExportedModel:
    """Write a learner's module state (full or LoRA adapter) as a model folder.

    Args:
        module_state: what ``CausalLMRLModule.get_state()`` returns (and checkpoints hold).
        base_model: the run's ``model_path`` (a folder, a hub id or a built-in name): the
            source of the config, the generation config and the tokenizer (with LoRA, a
            note of the base model in the adapter checkpoint wins).
        dtype: of the written weights; None keeps the learner's (for LoRA, ``base_dtype``).
        lora_mode: ``"merge"`` (a plain model) or ``"adapter"`` (a PEFT adapter folder);
            only for LoRA states.
        base_dtype: the dtype the learner loaded the base model in (``model_dtype``).
        max_shard_size: largest safetensors file, as transformers takes it (``"2GB"``).
        overwrite: replace an existing non-empty ``out_dir``.
    """
    if lora_mode not in LORA_EXPORT_MODES:
        raise ValueError(f"lora_mode must be one of {LORA_EXPORT_MODES}, got {lora_mode!r}")
    is_lora = lora.is_adapter_checkpoint(module_state)
    if lora_mode == "adapter" and not is_lora:
        raise ValueError("adapter-only export needs a LoRA checkpoint (lora_rank > 0); this one "
                         "holds the full weights: export it without adapter-only")
    if is_lora:
        base_model = str(module_state.get(lora.BASE_KEY) or base_model)
    base_dir = resolve_model(base_model)
    with _scratch_folder(out_dir, overwrite) as scratch:
        if is_lora and lora_mode == "adapter":
            kind, adapter = "lora-adapter", dict(module_state)
            tensors = {k: torch.as_tensor(v) for k, v in adapter[lora.ADAPTER_KEY].items()}
            written_dtype = dtype or stored_dtype(tensors)
            adapter[lora.ADAPTER_KEY] = {k: v.to(torch_dtype(written_dtype))
                                         for k, v in tensors.items()}
            adapter[lora.BASE_KEY] = _loadable_base(base_model, base_dir)
            lora.write_peft_adapter(adapter, scratch)
        else:
            if is_lora:
                kind, weights = "merged-lora", merge_adapter_checkpoint(
                    module_state, load_causal_lm(base_dir, dtype=base_dtype).state_dict())
            else:
                kind, weights = "full", dict(module_state)
            written_dtype = dtype or stored_dtype(weights)
            write_weights(weights, base_dir, scratch, dtype=written_dtype,
                          max_shard_size=max_shard_size)
        copy_tokenizer_files(base_dir, scratch)
        files = sorted(p.name for p in Path(scratch).iterdir())
    return ExportedModel(str(Path(out_dir).resolve()), kind, written_dtype, base_model, files)


def merge_adapter_checkpoint(
    adapter_state: Mapping[str, Any], base_state: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The base state dict with every adapted linear layer merged (``W + B @ A * scaling``)."""
    settings = dict(adapter_state[lora.SETTINGS_KEY])
    scaling = float(settings["alpha"]) / int(settings["rank"])
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in adapter_state[lora.ADAPTER_KEY].items():
        name = key.removeprefix(lora.PEFT_PREFIX)
        for part in ("lora_A", "lora_B"):
            marker = f".{part}."
            if marker in name:
                pairs.setdefault(name.split(marker)[0], {})[part] = torch.as_tensor(tensor)
                break
        else:
            raise ValueError(f"LoRA checkpoint key {key!r} is neither lora_A nor lora_B: "
                             "only adapters on linear layers can be merged")
    merged = dict(base_state)
    for module, pair in pairs.items():
        weight_key = f"{module}.weight"
        if weight_key not in merged or set(pair) != {"lora_A", "lora_B"}:
            raise ValueError(f"LoRA adapter on {module!r} does not fit the base model "
                             f"(has {sorted(pair)}; base key present: {weight_key in merged})")
        merged[weight_key] = lora.merge(merged[weight_key], pair["lora_A"], pair["lora_B"],
                                        scaling)
    return merged


def write_weights(
    state_dict: Mapping[str, torch.Tensor],
    base_dir: str,
    out_dir: str | os.PathLike,
    *,
    dtype: str,
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """``config.json``, ``generation_config.json`` and safetensors shards of ``state_dict``.

    The model is built on the meta device from the base config and takes the tensors
    as they are (cast to ``dtype``), so nothing is allocated twice; every key must fit
    (tied output embeddings may be absent).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    target = torch_dtype(dtype)
    config = AutoConfig.from_pretrained(base_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=target)
    weights = {k: torch.as_tensor(v).to(target) if torch.as_tensor(v).is_floating_point()
               else torch.as_tensor(v) for k, v in state_dict.items()}
    tied = _tied_keys(model)
    for target_key, source_key in tied.items():
        if target_key in weights and source_key in weights and not torch.equal(
                weights[target_key], weights[source_key]):
            raise ValueError(f"{target_key} differs from {source_key}, but the config ties them "
                             "(tie_word_embeddings): these weights are not of this model")
    result = model.load_state_dict(weights, strict=False, assign=True)
    missing = [k for k in result.missing_keys if k not in tied]
    if missing or result.unexpected_keys:
        raise ValueError(f"the weights do not fit {type(model).__name__} of {base_dir}: missing "
                         f"{missing[:5]}, unexpected {result.unexpected_keys[:5]}")
    model.tie_weights()
    try:
        model.generation_config = GenerationConfig.from_pretrained(base_dir)
    except OSError:  # no generation_config.json: the one derived from the config stays
        pass
    model.save_pretrained(str(out_dir), max_shard_size=max_shard_size)


def copy_tokenizer_files(base_dir: str, out_dir: str | os.PathLike) -> None:
    """The base model's tokenizer (and chat template) files, copied unchanged; a hub id's
    tokenizer is saved with ``save_pretrained``."""
    if Path(base_dir).is_dir():
        for name in TOKENIZER_FILES:
            if Path(base_dir, name).is_file():
                shutil.copy2(Path(base_dir, name), Path(out_dir, name))
        return
    from rllib_grpo.models.tokenizers import load_tokenizer

    load_tokenizer(base_dir).save_pretrained(str(out_dir))


def _tied_keys(model: Any) -> dict[str, str]:
    """``{tied key: source key}`` (``lm_head.weight`` -> ``model.embed_tokens.weight``)."""
    if not getattr(model.config.get_text_config(), "tie_word_embeddings", False):
        return {}
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if isinstance(tied, Mapping):
        return dict(tied)
    # Older transformers list the tied keys only; the source is the input embedding.
    return {key: "model.embed_tokens.weight" for key in tied}


def _loadable_base(base_model: str, base_dir: str) -> str:
    """The base model as PEFT's ``base_model_name_or_path`` should name it: a built-in
    name becomes its cached folder, a relative folder an absolute one; a hub id stays."""
    if Path(base_dir).is_dir():
        return str(Path(base_dir).resolve())
    return base_model


class _scratch_folder:
    """Write into a scratch folder beside ``out_dir``; rename it into place on success."""

    def __init__(self, out_dir: str | os.PathLike, overwrite: bool) -> None:
        self.out = Path(out_dir).resolve()
        if self.out.exists() and not self.out.is_dir():
            raise FileExistsError(f"{self.out} exists and is not a folder")
        if self.out.is_dir() and any(self.out.iterdir()) and not overwrite:
            raise FileExistsError(f"{self.out} exists and is not empty: choose a new folder, "
                                  "or overwrite it (--overwrite / overwrite=True)")

    def __enter__(self) -> str:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.scratch = tempfile.mkdtemp(prefix=f".{self.out.name}-", dir=self.out.parent)
        return self.scratch

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:
            shutil.rmtree(self.scratch, ignore_errors=True)
            return
        os.chmod(self.scratch, 0o755)  # mkdtemp makes it private
        if self.out.exists():
            shutil.rmtree(self.out)
        os.rename(self.scratch, self.out)
