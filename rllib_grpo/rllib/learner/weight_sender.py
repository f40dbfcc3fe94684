"""The learner side of a weight sync (`rllib_grpo.rllib.algorithm.weight_sync` drives it).

Each learner owns one `WeightSender` (`GRPOLearner.weight_sender`, made on first use); the
driver reaches it through the ``learner_*`` functions below, run on every learner by
``LearnerGroup.foreach_learner``.  Learner rank 0 is rank 0 of the weight group; with FSDP
every learner takes part in gathering each tensor from its shards, bucket by bucket, in the
manifest's order (a collective over the learners), and rank 0 packs and sends it: no
learner ever holds the whole gathered model.

What is sent: the policy's HF state dict as it lives on the learner's device (no host
copy, no clone; the wire cast happens while packing), or with LoRA the module's sync
payload (`rllib_grpo.models.lora.LoRAPayload`, flattened to named tensors; host copies,
so the plan never offers it to CUDA IPC: ``Endpoint.host_payload``).

CUDA IPC with FSDP (a runner on learner 0's GPU): every learner takes part in gathering
each full tensor, and rank 0 shares the gathered tensors; it holds them (the whole model,
once more) until the next sync or `WeightSender.done`.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, Protocol

import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from torch.distributed.fsdp import FSDPModule

from rllib_grpo.rllib.learner.distributed import rank
from rllib_grpo.rllib.placement import node_id
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
    GroupSpec,
    WeightGroup,
    open_store,
    share_cuda_tensors,
)

# Tensors this large that need no cast are broadcast from where they lie (no packing copy);
# smaller ones share a bucket, one message for many.
DIRECT_MIN_BYTES = 1 << 20


def policy_module(learner: Any) -> Any:
    """The learner's `CausalLMRLModule` (unwrapped from DDP)."""
    module = learner.module[DEFAULT_MODULE_ID]
    return module.unwrapped() if hasattr(module, "unwrapped") else module


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
        self._shared: dict[str, torch.Tensor] = {}  # what rank 0 shares by CUDA IPC

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
        return Endpoint(node_id(), os.getpid(), device.type, gpus, sharded=self.sharded,
                        host_payload=self.module.lora is not None)

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
            tensors = payload.to_tensors()
            aliases: tuple[tuple[str, str], ...] = ()
            meta = payload.sync_meta()
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
        if VIA_IPC in vias:
            staged["ipc"] = self._share(tensors)
        return staged

    def _share(self, tensors: dict[str, torch.Tensor]) -> dict | None:
        """CUDA IPC handles of the full tensors on rank 0 (None elsewhere).  FSDP shards are
        gathered first, a collective every learner joins in the same order."""
        full = {name: _gathered(t) for name, t in tensors.items()} if self.sharded else tensors
        if rank() != 0:
            return None
        self._shared = full  # alive until the receivers have copied (next stage or done)
        return share_cuda_tensors(full)

    def _manifest(self) -> Manifest:
        if self.manifest is None:
            raise RuntimeError("WeightSender: nothing staged yet (stage() plans the manifest)")
        return self.manifest

    def tensor(self, name: str) -> torch.Tensor:
        return _gathered(self._tensors[name])

    # ------------------------------------------------------------------ the group
    def open_group(self, world_size: int, backend: str, timeout_s: float) -> GroupSpec | None:
        """Host the group's rendezvous (learner rank 0); returns the `GroupSpec` (None on
        the other ranks)."""
        if rank() != 0:
            return None
        self.close()
        self.store, spec = open_store(ray.util.get_node_ip_address(), world_size, backend,
                                      timeout_s)
        return spec

    def join_group(self, spec: GroupSpec) -> None:
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
        self._tensors, self._shared = {}, {}

    def close(self) -> None:
        self.buckets.close()
        self.store = None


# --------------------------------------------------------------------------- the driver's calls
# Run on every learner (``foreach_learner``); each answers with its rank where the driver
# needs rank 0's answer.
class SendingLearner(Protocol):
    """A learner that owns a `WeightSender` (`rllib_grpo.rllib.learner.learner.GRPOLearner`)."""

    @property
    def weight_sender(self) -> WeightSender: ...


def learner_endpoint(learner: SendingLearner) -> tuple[int, Endpoint, int]:
    """``(rank, where the learner's weights live, their bytes)``."""
    sender = learner.weight_sender
    return rank(), sender.endpoint(), sender.state_nbytes()


def learner_open_group(learner: SendingLearner, world_size: int, backend: str,
                       timeout_s: float) -> tuple[int, GroupSpec | None]:
    """``(rank, the new group's spec)``: rank 0 hosts the rendezvous."""
    return rank(), learner.weight_sender.open_group(world_size=world_size, backend=backend,
                                                   timeout_s=timeout_s)


def learner_join_group(learner: SendingLearner, spec: GroupSpec) -> None:
    learner.weight_sender.join_group(spec)


def learner_stage(learner: SendingLearner, wire_dtype: torch.dtype | None, bucket_bytes: int,
                  vias: tuple[str, ...]) -> tuple[int, dict]:
    """``(rank, what `WeightSender.stage` staged)``."""
    return rank(), learner.weight_sender.stage(wire_dtype=wire_dtype, bucket_bytes=bucket_bytes,
                                              vias=vias)


def learner_send(learner: SendingLearner, via: str) -> None:
    learner.weight_sender.send(via)


def learner_local_state(learner: SendingLearner) -> tuple[Any, int]:
    """``(the live tensors or LoRA payload, the weights' sequence number)``, for a runner
    in this process."""
    sender = learner.weight_sender
    return sender.local_state(), sender.weights_seq_no()


def learner_done(learner: SendingLearner) -> None:
    """The runners have copied this sync (IPC): drop the shared tensors (FSDP: the gather)."""
    learner.weight_sender.done()


def learner_close(learner: SendingLearner) -> None:
    learner.weight_sender.close()
