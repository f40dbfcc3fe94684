"""The weight-transfer half of `rllib_grpo.samplers.vllm.VLLMSampler`: vLLM's own API.

The engine was created with the ``grpo`` backend (`rllib_grpo.weights.engines`), which
becomes the backend the init info names; every call fans out to the engine's workers with
``collective_rpc``.  The driver's planner (`rllib_grpo.weights.plan`) learns from
`VLLMWeightTransfer.rank_gpus` where the workers run.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch

from rllib_grpo.samplers.vllm_worker import worker_gpu_uuid
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.names import fused_closure, module_of
from rllib_grpo.weights.transport import GroupSpec, SlotsSpec
from rllib_grpo.weights.wire import (
    GLOO_BACKEND,
    BucketUpdate,
    DispatchInit,
    GroupInit,
    as_dict,
    manifest_from_wire,
    manifest_to_wire,
)

EMBED_KEY, LM_HEAD_KEY = "model.embed_tokens.weight", "lm_head.weight"


class VLLMWeightTransfer:
    """Mixed into `VLLMSampler` (which sets ``llm``, ``on_cpu``, ``tied_embeddings`` and
    ``_checkpoint_keys``): the receiving side of every weight sync."""

    llm: Any
    on_cpu: bool
    tied_embeddings: bool
    _checkpoint_keys: set[str]

    @property
    def device(self) -> torch.device:
        """Where the engine's weights live: ``cpu`` or ``cuda`` (its workers hold the GPUs)."""
        return torch.device("cpu" if self.on_cpu else "cuda")

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype weights should travel in: the engine's."""
        return self.llm.llm_engine.model_config.dtype

    @property
    def takes_gpu_engines(self) -> bool:
        """vLLM's GPU engines (``nccl``, ``ipc``, ``sparse_nccl``) load into this engine."""
        return not self.on_cpu

    @property
    def num_weight_ranks(self) -> int:
        """Ranks this engine takes in a weight group: one per worker."""
        return self.llm.llm_engine.vllm_config.parallel_config.world_size

    @property
    def rank_gpus(self) -> tuple[str, ...]:
        """The UUID of the GPU each worker runs on, in worker (weight-group rank) order: what
        the workers themselves report, so that an engine that narrowed
        ``CUDA_VISIBLE_DEVICES`` (a colocated tensor-parallel one) is placed right even
        where its env runner's CUDA saw Ray's single GPU.  Empty on CPU."""
        if self.on_cpu:
            return ()
        return tuple(str(uuid) for uuid in self.llm.collective_rpc(worker_gpu_uuid))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """vLLM's ``init_weight_transfer_engine`` on every worker (``{"backend", "init_info"}``:
        `rllib_grpo.weights.wire.DispatchInit`)."""
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        """vLLM's ``update_weights`` on every worker (a tied head that a bucket manifest
        lacks is added as an alias of the embeddings: vLLM keeps a head it is not given)."""
        if "manifest" in update_info:
            manifest = self._with_tied_head(manifest_from_wire(update_info["manifest"]))
            update_info = {**update_info, "manifest": manifest_to_wire(manifest)}
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self) -> None:
        """Finish the update on every worker, then drop the prefixes the old weights cached."""
        self.llm.collective_rpc("finish_weight_update")
        self.llm.reset_prefix_cache()

    def shutdown_weight_transfer_engine(self) -> None:
        self.llm.collective_rpc("shutdown_weight_transfer_engine")

    def join_weight_group(self, spec: GroupSpec, rank: int) -> None:
        """Every worker joins the gloo group ``spec`` (``grpo_gloo``/``grpo_shm`` engines),
        as ranks ``rank`` .. ``rank + num_weight_ranks - 1``."""
        self.init_weight_transfer_engine(as_dict(DispatchInit(
            GLOO_BACKEND, as_dict(GroupInit.of(spec, rank_offset=rank)))))

    def prepare_weights(self, manifest: Manifest, slots: SlotsSpec | None = None,
                        check: bool = True, in_place: bool = True) -> None:
        """Refuse a partial or foreign manifest (before any byte moves); keep the slots a
        ``shm`` receive reads.  (``in_place`` is the transformers sampler's.)"""
        if check:
            self._check_keys(self._with_tied_head(manifest).names(), partial=manifest.partial)
        self._slots = slots

    def receive_weights(self, manifest: Manifest, via: str, ipc: dict | None = None,
                        materialize: bool = False) -> dict:
        """One dense sync from the group joined by `join_weight_group`, through vLLM's API
        (start, update, finish).  CUDA IPC and LoRA payloads (``materialize``) go through
        vLLM's ``ipc`` engine and Ray's object store now."""
        if ipc is not None or materialize or via not in ("shm", "collective"):
            raise ValueError(f"VLLMSampler.receive_weights takes 'shm' or 'collective' syncs "
                             f"(got via={via!r}); CUDA IPC is vLLM's ipc engine")
        start = time.perf_counter()
        slots = getattr(self, "_slots", None) if via == "shm" else None
        info = BucketUpdate(manifest_to_wire(manifest), list(slots.paths) if slots else None,
                            slots.nbytes if slots else 0)
        self.start_weight_update()
        self.update_weights(as_dict(info))
        self.finish_weight_update()
        return {"bytes": manifest.nbytes, "seconds": time.perf_counter() - start}

    def leave_weight_group(self) -> None:
        """Every worker leaves the weight group (a no-op outside one)."""
        self.shutdown_weight_transfer_engine()

    def _with_tied_head(self, manifest: Manifest) -> Manifest:
        """vLLM keeps a tied head it is not given: send the embeddings under its name too."""
        names = manifest.names()
        if self.tied_embeddings and LM_HEAD_KEY not in names and EMBED_KEY in names:
            return dataclasses.replace(manifest,
                                       aliases=(*manifest.aliases, (LM_HEAD_KEY, EMBED_KEY)))
        return manifest

    def _with_lm_head(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        weights = dict(state_dict)
        if LM_HEAD_KEY not in weights and EMBED_KEY in weights and self.tied_embeddings:
            weights[LM_HEAD_KEY] = weights[EMBED_KEY]
        return weights

    def _check_keys(self, weights: Mapping[str, torch.Tensor] | set[str],
                    partial: bool = False) -> None:
        """vLLM keeps any weight it is not given; refuse a partial (unless ``partial``: then
        an incomplete fused layer) or foreign state dict."""
        if not self._checkpoint_keys:  # a hub id: nothing on disk to compare with
            return
        required = self._checkpoint_keys
        if partial:
            touched = fused_closure({module_of(k) for k in weights})
            required = {k for k in required if module_of(k) in touched}
        missing = required - set(weights)
        unexpected = set(weights) - self._checkpoint_keys - {LM_HEAD_KEY}
        if missing or unexpected:
            raise KeyError(
                f"state dict does not match the checkpoint: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
