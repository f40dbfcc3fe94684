"""The learner side of a weight sync (`rllib_grpo.rllib.algorithm.weight_sync` drives it).

Each learner holds one `WeightSender` (created on first use).  Learner rank 0 is rank 0 of
the weight group; with FSDP every learner takes part in gathering each tensor from its
shards, bucket by bucket, in the manifest's order (a collective over the learners), and
rank 0 packs and sends it: no learner ever holds the whole gathered model.

What is sent: the policy's HF state dict as it lives on the learner's device (no host
copy, no clone; the wire cast happens while packing), or with LoRA the module's sync
payload (`rllib_grpo.models.lora.LoRAPayload`, flattened to named tensors).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from torch.distributed.fsdp import FSDPModule

from rllib_grpo.models import lora
from rllib_grpo.rllib.learner.distributed import rank
from rllib_grpo.weights.layout import (
    Manifest,
    pipelined_bucket_bytes,
    plan_manifest,
    split_aliases,
    wire_nbytes,
)
from rllib_grpo.weights.plan import Endpoint
from rllib_grpo.weights.transport import (
    VIA_IPC,
    VIA_SHM,
    BucketSender,
    WeightGroup,
    open_store,
    share_cuda_tensors,
)

ATTR = "_rllib_grpo_weight_sender"
# Tensors this large that need no cast are broadcast from where they lie (no packing copy);
# smaller ones share a bucket, one message for many.
DIRECT_MIN_BYTES = 1 << 20
LORA_WEIGHT, LORA_A, LORA_B = "weights/", "lora_A/", "lora_B/"


def node_id() -> str:
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


def visible_gpus() -> tuple[str, ...]:
    if not torch.cuda.is_available():
        return ()
    return tuple(str(torch.cuda.get_device_properties(i).uuid)
                 for i in range(torch.cuda.device_count()))


def policy_module(learner: Any) -> Any:
    """The learner's `CausalLMRLModule` (unwrapped from DDP)."""
    module = learner.module[DEFAULT_MODULE_ID]
    return module.unwrapped() if hasattr(module, "unwrapped") else module


def sender_of(learner: Any) -> WeightSender:
    sender = learner.__dict__.get(ATTR)
    if sender is None:
        sender = learner.__dict__[ATTR] = WeightSender(learner)
    return sender


def lora_to_tensors(payload: lora.LoRAPayload) -> dict[str, torch.Tensor]:
    tensors = {LORA_WEIGHT + k: v for k, v in payload.weights.items()}
    for name, (a, b) in payload.adapter.items():
        tensors[LORA_A + name], tensors[LORA_B + name] = a, b
    return tensors


def lora_from_tensors(tensors: dict[str, torch.Tensor], meta: dict[str, Any]
                      ) -> lora.LoRAPayload:
    """The inverse of `lora_to_tensors` (on the env runner)."""
    weights = {k[len(LORA_WEIGHT):]: v for k, v in tensors.items() if k.startswith(LORA_WEIGHT)}
    adapter = {k[len(LORA_A):]: (v, tensors[LORA_B + k[len(LORA_A):]])
               for k, v in tensors.items() if k.startswith(LORA_A)}
    return lora.LoRAPayload(meta["lora_kind"], weights, adapter, meta["lora_scaling"])


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """A full tensor from FSDP shards (collective over the learners); others as they are."""
    if not hasattr(tensor, "full_tensor"):
        return tensor.detach()
    mesh_device = tensor.device_mesh.device_type  # type: ignore[attr-defined]  # a DTensor
    if tensor.device.type != mesh_device:  # CPU-offloaded shards of a GPU mesh
        tensor = tensor.to(mesh_device)
    return tensor.full_tensor().detach()


class WeightSender:
    """A learner's half of weight syncs: what to send, the group, the buckets."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.store: Any = None
        self.buckets = BucketSender()
        self.manifest: Manifest | None = None
        self._planned_for: tuple | None = None
        self._tensors: dict[str, torch.Tensor] = {}

    @property
    def module(self) -> Any:
        return policy_module(self.learner)

    @property
    def sharded(self) -> bool:
        return isinstance(getattr(self.module, "lm", None), FSDPModule)

    def _on_device(self) -> Any:
        """The learner's CUDA device as current (threads start on device 0), else nothing."""
        device = next(self.module.lm.parameters()).device
        return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

    def endpoint(self) -> Endpoint:
        device = next(self.module.lm.parameters()).device
        gpus = (str(torch.cuda.get_device_properties(device).uuid),) if device.type == "cuda" \
            else ()
        return Endpoint(node_id(), os.getpid(), device.type, gpus, sharded=self.sharded)

    def state_nbytes(self) -> int:
        """Bytes of the policy's distinct tensors as the learner holds them."""
        tensors, _ = split_aliases(self.module.lm.state_dict())
        return sum(t.numel() * t.element_size() for t in tensors.values())

    def weights_seq_no(self) -> int:
        return int(getattr(self.learner, "_weights_seq_no", 0))

    # ------------------------------------------------------------------ what to send
    def local_state(self) -> Any:
        """For a runner in this process: the live tensors themselves (or a LoRA payload)."""
        module = self.module
        if module.lora is not None:
            return module.get_state(inference_only=True)
        return {k: v.detach() for k, v in module.lm.state_dict().items()}

    def stage(self, wire_dtype: torch.dtype | None, bucket_bytes: int,
              vias: tuple[str, ...]) -> dict:
        """Lay out this sync, with the shared-memory slots (``shm``) or the shared tensors
        (``ipc``) rank 0 sends it through.  On every learner."""
        module = self.module
        meta: dict[str, Any] = {}
        if module.lora is not None:
            payload = module.get_state(inference_only=True)
            tensors = lora_to_tensors(payload)
            aliases: tuple[tuple[str, str], ...] = ()
            meta = {"lora_kind": payload.kind, "lora_scaling": payload.scaling}
        else:
            tensors, aliases = split_aliases(module.lm.state_dict())
        self._tensors = tensors
        # The layout changes only with the tensors' names, shapes and dtypes: plan it once.
        key = (tuple((n, tuple(t.shape), t.dtype, t.is_contiguous()) for n, t in tensors.items()),
               aliases, wire_dtype, bucket_bytes, tuple(sorted(meta.items())))
        if key != self._planned_for:
            total = wire_nbytes(tensors, wire_dtype)
            self.manifest = plan_manifest(
                tensors, wire_dtype=wire_dtype, aliases=aliases, meta=meta,
                bucket_bytes=pipelined_bucket_bytes(total, bucket_bytes),
                direct_min_bytes=DIRECT_MIN_BYTES)
            self._planned_for = key
        manifest = self._manifest()
        staged: dict[str, Any] = {"manifest": manifest, "rank": rank(), "slots": None,
                                  "ipc": None, "seq_no": self.weights_seq_no()}
        if rank() == 0 and VIA_SHM in vias:
            staged["slots"] = self.buckets.ensure_slots(max(1, manifest.max_bucket_bytes))
        if rank() == 0 and VIA_IPC in vias:
            staged["ipc"] = share_cuda_tensors(self._tensors)
        return staged

    def _manifest(self) -> Manifest:
        if self.manifest is None:
            raise RuntimeError("WeightSender: nothing staged yet (stage() plans the manifest)")
        return self.manifest

    def tensor(self, name: str) -> torch.Tensor:
        return _gathered(self._tensors[name])

    # ------------------------------------------------------------------ the group
    def open_group(self, world_size: int, backend: str, timeout_s: float) -> Any:
        """Host the group's rendezvous (learner rank 0); returns the `GroupSpec`."""
        if rank() != 0:
            return None
        self.close()
        self.store, spec = open_store(ray.util.get_node_ip_address(), world_size, backend,
                                      timeout_s)
        return spec

    def join_group(self, spec: Any) -> None:
        if rank() == 0:
            with self._on_device():
                self.buckets.group = WeightGroup(spec, 0, self.store)

    def send(self, via: str) -> None:
        """Stream the staged sync; other FSDP ranks only gather, in the same order."""
        if rank() == 0:
            if via == VIA_SHM and self.buckets.slots is not None:
                self.buckets.slots.unlink()  # every receiver has mapped them by now
            with self._on_device():
                self.buckets.send(self._manifest(), self.tensor, via)
        elif self.sharded:
            for bucket in self._manifest().buckets:
                for entry in bucket.entries:
                    self.tensor(entry.name)
        self._tensors = {}

    def done(self) -> None:
        """The sync is over: drop the references to this step's tensors (IPC kept them)."""
        self._tensors = {}

    def close(self) -> None:
        self.buckets.close()
        self.store = None
