"""LoRA through ``peft``: the policy's adapter, its weight sync and its checkpoints.

With ``lora_rank > 0`` the learner's `CausalLMRLModule` wraps its causal LM
with ``peft.get_peft_model``: the base weights are frozen and only the
adapter's A and B matrices train (the optimizer takes ``requires_grad``
parameters).  As in verl (``ref_in_actor``):

* the reference policy is the same model with the adapter disabled
  (``with lm.disable_adapter(): ...``), so no second copy of the weights;
* the first weight sync to the env runners sends the full base weights (HF
  names, as the samplers expect) plus the adapter; later syncs send the
  adapter alone (``lora_sync="adapter"``: each runner merges
  ``W = W_base + (B @ A) * alpha / r`` into its sampler from its own host copy
  of the adapted base weights) or the merged weights of the adapted layers
  (``lora_sync="merged"``: merged on the learner).  Samplers load such partial
  state dicts with ``load_weights(..., partial=True)``; every vLLM layer that is
  touched is loaded whole (q/k/v and gate/up are fused there);
* a checkpoint's module state is the adapter plus a note of the base model,
  also written in PEFT's own format (``adapter/`` next to the module state);
  restoring loads the base from ``model_path`` and the adapter from the checkpoint.

Only ``torch.nn.Linear`` layers take adapters (``all-linear`` or names such
as ``q_proj``): merging on the samplers needs no more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

logger = logging.getLogger(__name__)

LORA_SYNC_MODES = ("adapter", "merged")
ADAPTER = "default"  # peft's adapter name
PEFT_PREFIX = "base_model.model."  # peft's prefix before the HF names
# Projections vLLM loads into one fused parameter: a partial sync carries all of a group or none.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def module_of(key: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``model.layers.0.self_attn.q_proj``."""
    return key.rpartition(".")[0]


def fused_closure(modules: set[str]) -> set[str]:
    """``modules`` plus their fused siblings (``...q_proj`` brings ``...k_proj``, ``...v_proj``)."""
    out = set(modules)
    for name in modules:
        parent, _, leaf = name.rpartition(".")
        for group in FUSED_GROUPS:
            if leaf in group:
                out |= {f"{parent}.{sibling}" if parent else sibling for sibling in group}
    return out


@dataclass(frozen=True)
class LoRASettings:
    """The LoRA knobs of `rllib_grpo.rllib.config.settings` (``lora_*``) as the module receives them."""

    rank: int
    alpha: float = 16.0
    target_modules: str | tuple[str, ...] = "all-linear"
    dropout: float = 0.0
    sync: str = "adapter"

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    @classmethod
    def from_model_config(cls, cfg: Mapping[str, Any]) -> LoRASettings | None:
        """Settings from the RLModule's ``model_config``; None when LoRA is off."""
        rank = int(cfg.get("lora_rank") or 0)
        if rank <= 0:
            return None
        targets = cfg.get("lora_target_modules", "all-linear")
        return cls(rank=rank, alpha=float(cfg.get("lora_alpha", 16)),
                   target_modules=targets if isinstance(targets, str) else tuple(targets),
                   dropout=float(cfg.get("lora_dropout", 0.0)),
                   sync=cfg.get("lora_sync", "adapter"))

    def peft_config(self, base_model: str | None = None) -> Any:
        from peft import LoraConfig

        targets = self.target_modules
        return LoraConfig(r=self.rank, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=targets if isinstance(targets, str) else list(targets),
                          bias="none", task_type="CAUSAL_LM", base_model_name_or_path=base_model)


# --------------------------------------------------------------------------- the model
def wrap_with_lora(lm: torch.nn.Module, settings: LoRASettings) -> torch.nn.Module:
    """``peft.get_peft_model``: base weights frozen, adapter trainable, in eval mode."""
    from peft import get_peft_model

    if getattr(lm, "is_gradient_checkpointing", False):
        # Frozen embeddings give checkpointed blocks inputs without grad: no adapter grads.
        lm.enable_input_require_grads()  # type: ignore[operator]
    model = get_peft_model(lm, settings.peft_config())
    for name, layer in lora_layers(model).items():
        if not isinstance(layer.base_layer, torch.nn.Linear):
            raise ValueError(f"lora_target_modules: {name} is a {type(layer.base_layer).__name__};"
                             " only linear layers take adapters here.")
        if settings.dropout:
            layer.lora_dropout[ADAPTER] = GradOnlyDropout(settings.dropout)
    return model.eval()  # get_peft_model switches to train mode


def lora_layers(model: torch.nn.Module) -> dict[str, Any]:
    """Adapted layers by HF module name (``model.layers.0.self_attn.q_proj``)."""
    from peft.tuners.lora import LoraLayer

    return {_hf_name(name): module for name, module in model.named_modules()
            if isinstance(module, LoraLayer)}


def _hf_name(name: str) -> str:
    name = name.removeprefix(PEFT_PREFIX)
    return name.replace(".base_layer", "")


class GradOnlyDropout(torch.nn.Dropout):
    """The adapters' dropout: active in training mode with gradients on, i.e. in the
    loss's forward (and its recomputation under gradient checkpointing), never in the
    learner's no-grad passes (old and reference log-probs) or on the samplers."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            return super().forward(x)
        return x


# --------------------------------------------------------------------------- sync payloads
@dataclass
class LoRAPayload:
    """What one weight sync sends from the learner to the env runners.

    ``kind``: ``"full"`` (every base weight by HF name, unmerged, plus the adapter),
    ``"adapter"`` (the adapter alone) or ``"merged"`` (merged weights of the adapted
    layers and their fused siblings).  ``adapter`` maps an HF module name to ``(A, B)``.
    """

    kind: str
    weights: dict[str, torch.Tensor] = field(default_factory=dict)
    adapter: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    scaling: float = 1.0

    def nbytes(self) -> int:
        """Bytes of tensor data that cross from the learner to a runner."""
        tensors = [*self.weights.values(), *(t for pair in self.adapter.values() for t in pair)]
        return sum(t.numel() * t.element_size() for t in tensors)

    # A weight sync streams named tensors: the payload flattened, its kind and scaling in
    # the manifest's meta (which also tells the receiver to rebuild a payload).
    def to_tensors(self) -> dict[str, torch.Tensor]:
        """The payload as named tensors (``weights/…``, ``lora_A/…``, ``lora_B/…``)."""
        tensors = {SYNC_WEIGHT + k: v for k, v in self.weights.items()}
        for name, (a, b) in self.adapter.items():
            tensors[SYNC_A + name], tensors[SYNC_B + name] = a, b
        return tensors

    def sync_meta(self) -> dict[str, Any]:
        """What `from_tensors` needs besides the tensors."""
        return {SYNC_KIND: self.kind, SYNC_SCALING: self.scaling}

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]
                     ) -> LoRAPayload:
        """The inverse of `to_tensors` (on the env runner), with the `sync_meta`."""
        weights = {k[len(SYNC_WEIGHT):]: v for k, v in tensors.items()
                   if k.startswith(SYNC_WEIGHT)}
        adapter = {k[len(SYNC_A):]: (v, tensors[SYNC_B + k[len(SYNC_A):]])
                   for k, v in tensors.items() if k.startswith(SYNC_A)}
        return cls(meta[SYNC_KIND], weights, adapter, meta[SYNC_SCALING])


# The names a flattened payload travels under (`LoRAPayload.to_tensors`).
SYNC_WEIGHT, SYNC_A, SYNC_B = "weights/", "lora_A/", "lora_B/"
SYNC_KIND, SYNC_SCALING = "lora_kind", "lora_scaling"


def base_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The frozen base weights under their HF names (CPU copies)."""
    state = model.get_base_model().state_dict()  # type: ignore[operator]
    return {k.replace(".base_layer", ""): v.detach().cpu().clone()
            for k, v in state.items() if ".lora_" not in k}


def adapter_tensors(model: torch.nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{HF module name: (A, B)}`` of the active adapter (CPU copies)."""
    return {name: (layer.lora_A[ADAPTER].weight.detach().cpu().clone(),
                   layer.lora_B[ADAPTER].weight.detach().cpu().clone())
            for name, layer in lora_layers(model).items()}


def merge(base: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scaling: float) -> torch.Tensor:
    """``W + (B @ A) * scaling`` computed in float32, returned in W's dtype (peft's merge)."""
    delta = (b.float() @ a.float()) * scaling
    return (base.float() + delta).to(base.dtype)


def merged_weights(model: torch.nn.Module, settings: LoRASettings) -> dict[str, torch.Tensor]:
    """Merged weights of the adapted layers, and the base tensors of their fused siblings."""
    base, adapter = base_state_dict(model), adapter_tensors(model)
    wanted = fused_closure(set(adapter))
    out = {k: v for k, v in base.items() if module_of(k) in wanted}
    for name, (a, b) in adapter.items():
        out[f"{name}.weight"] = merge(out[f"{name}.weight"], a, b, settings.scaling)
    return out


def sync_payload(model: torch.nn.Module, settings: LoRASettings, first: bool) -> LoRAPayload:
    """The payload of one sync: full the first time, then per ``settings.sync``."""
    if first:
        return LoRAPayload("full", base_state_dict(model), adapter_tensors(model),
                           settings.scaling)
    if settings.sync == "merged":
        return LoRAPayload("merged", merged_weights(model, settings), scaling=settings.scaling)
    return LoRAPayload("adapter", adapter=adapter_tensors(model), scaling=settings.scaling)


# --------------------------------------------------------------------------- runner side
class AdapterMerger:
    """Env-runner side of the LoRA sync: merges adapters into the sampler's weights.

    Keeps a host copy of the base weights of the adapted layers (and their fused
    siblings), taken from the first full sync, or read from ``model_path`` when a
    runner joins after it (a restarted or added runner).
    """

    def __init__(self, model_path: str, dtype: str = "float32") -> None:
        self.model_path, self.dtype = model_path, dtype
        self.base: dict[str, torch.Tensor] = {}

    def apply(self, sampler: Any, payload: LoRAPayload) -> dict[str, Any]:
        """Load ``payload`` into ``sampler``; ``bytes`` is what crossed from the learner."""
        start = time.perf_counter()
        if payload.kind == "full":
            wanted = fused_closure(set(payload.adapter))
            self.base = {k: v for k, v in payload.weights.items() if module_of(k) in wanted}
            weights = {**payload.weights, **self._merged(payload)}
            stats = sampler.load_weights(weights)
        elif payload.kind == "adapter":
            stats = sampler.load_weights(self._merged(payload), partial=True)
        elif payload.kind == "merged":
            stats = sampler.load_weights(payload.weights, partial=True)
        else:
            raise ValueError(f"unknown LoRA payload kind {payload.kind!r}")
        return {"bytes": payload.nbytes(), "loaded_bytes": stats["bytes"], "kind": payload.kind,
                "seconds": time.perf_counter() - start}

    def _merged(self, payload: LoRAPayload) -> dict[str, torch.Tensor]:
        """Merged adapted weights plus the base tensors of every touched module."""
        wanted = fused_closure(set(payload.adapter))
        self._ensure_base(wanted)
        out = {k: v for k, v in self.base.items() if module_of(k) in wanted}
        for name, (a, b) in payload.adapter.items():
            out[f"{name}.weight"] = merge(self.base[f"{name}.weight"], a, b, payload.scaling)
        return out

    def _ensure_base(self, modules: set[str]) -> None:
        if modules <= {module_of(k) for k in self.base}:
            return
        logger.info("LoRA sync: no base copy of %d layers yet; reading them from %s",
                    len(modules), self.model_path)
        from rllib_grpo.models.loading import load_causal_lm

        state = load_causal_lm(self.model_path, dtype=self.dtype).state_dict()
        self.base.update({k: v for k, v in state.items() if module_of(k) in modules})


def is_lora_payload(state: Any) -> bool:
    return isinstance(state, LoRAPayload)


# --------------------------------------------------------------------------- checkpoints
ADAPTER_KEY, BASE_KEY, SETTINGS_KEY = "lora_adapter", "base_model", "lora"
ADAPTER_DIR = "adapter"


def adapter_checkpoint(model: torch.nn.Module, settings: LoRASettings, base_model: str
                       ) -> dict[str, Any]:
    """A module state holding the adapter alone, with the base model it belongs to."""
    from peft import get_peft_model_state_dict

    tensors = get_peft_model_state_dict(model, adapter_name=ADAPTER)
    return {ADAPTER_KEY: {k: v.detach().cpu().clone() for k, v in tensors.items()},
            BASE_KEY: base_model, SETTINGS_KEY: asdict(settings)}


def is_adapter_checkpoint(state: Mapping[str, Any]) -> bool:
    return isinstance(state, Mapping) and ADAPTER_KEY in state


def load_adapter_checkpoint(model: torch.nn.Module, state: Mapping[str, Any],
                            base_model: str) -> None:
    """Load an `adapter_checkpoint` into the peft model (the base stays as loaded)."""
    from peft import set_peft_model_state_dict

    if state.get(BASE_KEY) != base_model:
        logger.warning("LoRA adapter saved for base model %r is loaded onto %r",
                       state.get(BASE_KEY), base_model)
    tensors = {k: torch.as_tensor(v) for k, v in state[ADAPTER_KEY].items()}
    result = set_peft_model_state_dict(model, tensors, adapter_name=ADAPTER)
    missing = [k for k in result.missing_keys if ".lora_" in k]
    if missing or result.unexpected_keys:
        raise KeyError(f"LoRA checkpoint does not fit the model: missing {missing}, "
                       f"unexpected {result.unexpected_keys}")


def write_peft_adapter(state: Mapping[str, Any], folder: str | Path) -> None:
    """Write an `adapter_checkpoint` in PEFT's format (``PeftModel.from_pretrained`` loads it)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    settings = dict(state[SETTINGS_KEY])
    targets = settings["target_modules"]
    settings["target_modules"] = targets if isinstance(targets, str) else tuple(targets)
    config = LoRASettings(**settings).peft_config(base_model=state[BASE_KEY])
    config.save_pretrained(str(folder))
    tensors = {k: torch.as_tensor(v).contiguous() for k, v in state[ADAPTER_KEY].items()}
    save_file(tensors, str(folder / "adapter_model.safetensors"))
