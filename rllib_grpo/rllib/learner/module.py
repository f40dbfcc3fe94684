"""A transformers causal LM as an RLlib `TorchRLModule`.

The module holds the policy (`lm`) and, when a KL term is on, a frozen
reference copy (`ref_lm`, never trained, never synced, not part of the state).
Its forward returns the response tokens' log-probs at the sampling temperature
(and their entropy), which is all the GRPO loss needs.

Precision (`rllib_grpo.models.precision`): the policy's trained parameters are held in
``master_weights_dtype`` (fp32) and every forward runs under `compute_autocast` to
``dtype`` (bf16); the reference is loaded in ``dtype`` (frozen, forward only); a weight
sync sends the weights cast to the samplers' dtype (``sync_dtype``).
"""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path
from typing import Any

import torch
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.core.rl_module.torch import TorchRLModule
from ray.rllib.utils.annotations import override
from torch.distributed.fsdp import FSDPModule

from rllib_grpo.algos import entropy_from_logits, logprobs_from_logits
from rllib_grpo.algos.token_stats import chunked_token_stats
from rllib_grpo.models import lora
from rllib_grpo.models.lm_head import token_stats_mode
from rllib_grpo.models.loading import load_causal_lm, torch_dtype
from rllib_grpo.models.model_registry import resolve_model
from rllib_grpo.models.offload import HostOffloaded
from rllib_grpo.models.packing import packed_response_log_probs
from rllib_grpo.models.precision import cast_floating, compute_autocast, trained_dtype
from rllib_grpo.models.shared_prefix import shared_prefix_layout
from rllib_grpo.models.vision_forward import (
    has_vision_inputs,
    vision_response_log_probs,
    vision_tower,
)


def response_log_probs(
    lm: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    with_entropy: bool = False,
    *,
    packed: bool = False,
    share_prompts: bool = False,
    detach_entropy: bool = False,
    token_stats: str = "full",
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy) of the response tokens under ``lm`` at ``temperature``.

    Args:
        batch: ``prompt_ids``/``prompt_mask`` (B, P), left-padded, and
            ``response_ids``/``response_mask`` (B, R), right-padded; rows with images
            also carry their ``multi_modal_inputs``.
        packed: run on packed rows without padding (`rllib_grpo.models.packing`; the
            same values to float precision), else on the padded rows with a mask.
        share_prompts: packed, the responses of one prompt share one copy of it where
            the attention takes a custom mask (`rllib_grpo.models.shared_prefix`).
        detach_entropy: the entropy is for metrics only: no graph behind it.
        token_stats: ``"full"`` (log-softmax over the whole response logits), ``"chunked"``,
            ``"fused"`` (with the LM head) or ``"auto"``: `rllib_grpo.models.lm_head`.

    Returns:
        ``{"log_probs": (B, R), "entropy": (B, R) if with_entropy}``; padding
        positions hold values that the caller masks out.
    """
    if has_vision_inputs(batch):  # rows with images: `rllib_grpo.models.vision_forward`
        return vision_response_log_probs(lm, batch, temperature, with_entropy, packed=packed,
                                         detach_entropy=detach_entropy, token_stats=token_stats)
    if packed:
        layout = shared_prefix_layout(lm, batch) if share_prompts else None
        return packed_response_log_probs(lm, batch, temperature, with_entropy,
                                         detach_entropy=detach_entropy, layout=layout,
                                         token_stats=token_stats)
    prompt_len = batch["prompt_ids"].shape[1]
    input_ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1).long()
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    # Left padding shifts the real tokens, so positions must come from the mask.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    if token_stats_mode(lm, token_stats) != "full":  # padded rows: chunks of the logits
        logits = lm(input_ids=input_ids, attention_mask=attention_mask,
                    position_ids=position_ids, use_cache=False,
                    logits_to_keep=batch["response_ids"].shape[1] + 1).logits[:, :-1]
        shape = batch["response_ids"].shape
        log_probs, entropy = chunked_token_stats(
            logits.reshape(-1, logits.shape[-1]), batch["response_ids"].reshape(-1),
            temperature, with_entropy=with_entropy, stats_dtype=torch.float32)
        out = {"log_probs": log_probs.view(shape)}
        if entropy is not None:
            out["entropy"] = (entropy.detach() if detach_entropy else entropy).view(shape)
        return out
    logits = lm(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        use_cache=False,
    ).logits
    # Logits at position t predict token t+1: the response is predicted from P-1 .. P+R-2.
    response_logits = logits[:, prompt_len - 1 : -1].float() / temperature
    out = {"log_probs": logprobs_from_logits(response_logits, batch["response_ids"].long())}
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_entropy):
            out["entropy"] = entropy_from_logits(response_logits)
    return out


def reference_copy(policy: torch.nn.Module, ref_dtype: str) -> torch.nn.Module | None:
    """The reference model as a copy of the policy just loaded, where both hold the same
    dtype, as TRL makes its reference: one read of the folder, not two (a copy in memory
    is faster than a second load).

    None where the dtypes differ (a bf16 reference beside fp32 master weights is loaded in
    bf16, with the attention that dtype selects, `rllib_grpo.models.attention`), or where
    the policy checkpoints its activations (the reference is loaded without)."""
    weights = next(policy.parameters(), None)
    if (weights is None or weights.dtype != torch_dtype(ref_dtype)
            or getattr(policy, "is_gradient_checkpointing", False)):
        return None
    return copy.deepcopy(policy)


@contextlib.contextmanager
def _resharded_after(lm: FSDPModule) -> Any:
    try:
        yield
    finally:
        lm.reshard()


class CausalLMRLModule(TorchRLModule, InferenceOnlyAPI):
    """RLModule around a Hugging Face causal LM (policy + optional frozen reference).

    ``model_config`` keys: ``model`` (path / id / builtin name), ``dtype``,
    ``gradient_checkpointing``, ``temperature``, ``use_reference``, ``lora_*`` (LoRA
    through peft, `rllib_grpo.models.lora`: the reference is then the policy with its adapter
    disabled) and ``ref_param_offload`` (the reference kept in host memory).  An FSDP
    learner (`rllib_grpo.rllib.learner.fsdp`) adds ``sharded`` (every rank: a host-offloaded
    reference stays a submodule, which FSDP shards into host memory) and ``on_meta`` (every
    rank but 0: the models' structure only, on the meta device; rank 0's weights fill the
    shards).
    """

    @override(TorchRLModule)
    def setup(self) -> None:
        cfg = self.model_config
        path = resolve_model(cfg["model"])
        self.temperature = float(cfg.get("temperature", 1.0))
        overrides = cfg.get("config_overrides") or {}
        self.compute_dtype = cfg.get("dtype", "float32")
        self.packed = bool(cfg.get("use_remove_padding", False))  # padding-free forwards
        self.share_prompts = bool(cfg.get("share_prompt_prefix", False))  # one copy per group
        self.token_stats = str(cfg.get("token_stats", "full"))  # rllib_grpo.models.lm_head
        self.lora = lora.LoRASettings.from_model_config(cfg)
        # Trained weights in the master dtype; a LoRA base is frozen (its adapter stays in
        # fp32, peft's default) and a sampler-side module never trains: both compute dtype.
        trains_full = self.lora is None and not self.inference_only
        on_meta = bool(cfg.get("on_meta", False))
        self.lm = load_causal_lm(
            path, dtype=cfg.get("master_weights_dtype", "float32") if trains_full
            else self.compute_dtype,
            gradient_checkpointing=cfg.get("gradient_checkpointing", False),
            config_overrides=overrides, on_meta=on_meta,
        )
        if cfg.get("freeze_vision_tower"):  # verl's: the language model trains alone
            vision_tower(self.lm).requires_grad_(False)
        self._lora_synced = False  # the first sync of a LoRA policy sends the base weights too
        if self.lora is not None:
            self.lm = lora.wrap_with_lora(self.lm, self.lora)
        self.ref_lm = None
        self._host_ref: HostOffloaded | None = None  # not a submodule: .to(device) skips it
        if cfg.get("use_reference") and not self.inference_only and self.lora is None:
            ref_lm = reference_copy(self.lm, cfg.get("dtype", "float32")) or load_causal_lm(
                path, dtype=cfg.get("dtype", "float32"), config_overrides=overrides,
                on_meta=on_meta)
            ref_lm.requires_grad_(False)
            ref_lm.eval()
            if cfg.get("ref_param_offload") and not cfg.get("sharded"):
                self._host_ref = HostOffloaded(ref_lm)
            else:  # sharded and offloaded: FSDP keeps this rank's shard in host memory
                self.ref_lm = ref_lm

    @override(InferenceOnlyAPI)
    def get_non_inference_attributes(self) -> list[str]:
        return ["ref_lm"]

    @override(torch.nn.Module)
    def train(self, mode: bool = True) -> CausalLMRLModule:
        """RLlib's ``forward_train`` calls ``train()`` on the whole module: the frozen
        reference stays in eval mode whatever is asked."""
        super().train(mode)
        ref_lm = getattr(self, "ref_lm", None)  # None also before setup() ran
        if ref_lm is not None:
            ref_lm.eval()
        return self

    def autocast(self) -> Any:
        """The compute-dtype context of the policy's forward passes: bf16 autocast over fp32
        master weights; nothing when sharded (FSDP2's MixedPrecisionPolicy casts) or when
        the weights already are the compute dtype."""
        if isinstance(self.lm, FSDPModule):
            return contextlib.nullcontext()
        device = next(self.lm.parameters()).device.type
        return compute_autocast(trained_dtype(self.lm), self.compute_dtype, device)

    @override(TorchRLModule)
    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        with self.autocast():
            return response_log_probs(
                self.lm, batch, self.temperature, with_entropy=kwargs.get("with_entropy", True),
                packed=kwargs.get("packed", self.packed), share_prompts=self.share_prompts,
                detach_entropy=kwargs.get("detach_entropy", False),
                token_stats=self.token_stats,
            )

    @override(TorchRLModule)
    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad(), self.autocast():
            return response_log_probs(self.lm, batch, self.temperature, with_entropy=True,
                                      packed=self.packed, share_prompts=self.share_prompts,
                                      token_stats=self.token_stats)

    def reference_on(self, device: torch.device) -> contextlib.AbstractContextManager[Any]:
        """Hold a host-offloaded reference (``ref_param_offload``) on ``device`` for a whole
        pass: one move in and one out for all its micro-batches' `reference_log_probs`.
        A sharded reference visits the device one FSDP unit at a time; after the pass its
        root unit (embeddings, head), which FSDP2 keeps gathered after a forward, is
        resharded.  Nothing to do for a reference that lives on the device or in the policy."""
        if self._host_ref is not None:
            return self._host_ref.on(device)
        if isinstance(self.ref_lm, FSDPModule):
            return _resharded_after(self.ref_lm)
        return contextlib.nullcontext()

    @torch.no_grad()
    def reference_log_probs(self, batch: dict[str, Any], packed: bool | None = None
                            ) -> torch.Tensor:
        """Response log-probs under the frozen reference model, (B, R); ``packed``: on
        padding-free rows (None: the module's ``use_remove_padding``)."""
        t, packed = self.temperature, self.packed if packed is None else packed
        kw: dict[str, Any] = {"packed": packed, "share_prompts": self.share_prompts,
                              "token_stats": self.token_stats}
        if self.lora is not None:  # verl's ref_in_actor: the base model is the reference
            with self.lm.disable_adapter(), self.autocast():
                return response_log_probs(self.lm, batch, t, **kw)["log_probs"]
        if self._host_ref is not None:
            with self._host_ref.on(batch["prompt_ids"].device) as ref_lm:
                return response_log_probs(ref_lm, batch, t, **kw)["log_probs"]
        if self.ref_lm is None:
            raise RuntimeError("No reference model: set use_kl_loss or use_kl_in_reward.")
        return response_log_probs(self.ref_lm, batch, t, **kw)["log_probs"]

    # bf16-safe state: RLlib's default converts to numpy, which has no bfloat16.
    # Always the full HF state dict: an FSDP-sharded `lm` (rllib_grpo.rllib.learner.fsdp) is gathered
    # to rank 0 (other ranks get {}), so both calls are collective there.
    # With LoRA: a weight sync (inference_only) gets a `lora.LoRAPayload`, a checkpoint
    # the adapter alone (`lora.adapter_checkpoint`).
    @override(TorchRLModule)
    def get_state(self, components=None, *, not_components=None, inference_only=False, **kw):
        if self.lora is not None:
            return self._lora_state(inference_only)
        sharded = isinstance(self.lm, FSDPModule)  # a flag: FSDPModule is no nn.Module type
        if sharded:
            from rllib_grpo.rllib.learner.distributed import gather_full_state_dict

            state = gather_full_state_dict(self.lm)
            return self._for_sync(state) if inference_only else state
        state = {k: v.detach() for k, v in self.lm.state_dict().items()}
        if inference_only:
            # A weight sync, in the samplers' dtype (cast on the device, before the copy to
            # host).  Every consumer (load_state_dict, vLLM's reload_weights, ray.put) copies
            # at once, so an uncast tensor is not cloned: a clone would be a third copy.
            return {k: v.cpu() for k, v in self._for_sync(state).items()}
        return {k: v.to("cpu", copy=True) for k, v in state.items()}  # a snapshot

    def _for_sync(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return cast_floating(state, self.model_config.get("sync_dtype", self.compute_dtype))

    @override(TorchRLModule)
    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.lora is not None or lora.is_adapter_checkpoint(state):
            return self._set_lora_state(state)
        if isinstance(self.lm, FSDPModule):
            from rllib_grpo.rllib.learner.distributed import load_full_state_dict

            return load_full_state_dict(self.lm, state)  # type: ignore[arg-type]
        self.lm.load_state_dict(
            {k: torch.as_tensor(v) for k, v in state.items()}, strict=True
        )

    # ---------------------------------------------------------------- LoRA
    def _lora_state(self, for_sync: bool) -> Any:
        assert self.lora is not None
        if not for_sync:
            return lora.adapter_checkpoint(self.lm, self.lora, self.model_config["model"])
        payload = lora.sync_payload(self.lm, self.lora, first=not self._lora_synced)
        self._lora_synced = True
        return payload

    def _set_lora_state(self, state: dict[str, Any]) -> None:
        if self.lora is None or not lora.is_adapter_checkpoint(state):
            raise ValueError("A LoRA adapter checkpoint loads into a module with the same "
                             "lora_rank > 0 (and a full state dict into one without LoRA).")
        lora.load_adapter_checkpoint(self.lm, state, self.model_config["model"])

    @override(TorchRLModule)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint; with LoRA also the adapter in PEFT's format (``adapter/``)."""
        path = super().save_to_path(path, state=state, filesystem=filesystem,
                                    use_msgpack=use_msgpack)
        local = filesystem is None or type(filesystem).__name__ == "LocalFileSystem"
        if self.lora is not None and local:
            lora.write_peft_adapter(state or self.get_state(), Path(path, lora.ADAPTER_DIR))
        return path
