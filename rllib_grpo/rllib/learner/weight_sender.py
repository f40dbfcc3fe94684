"""The learners' side of a weight sync: what they offer when the driver asks.

The driver (`rllib_grpo.rllib.algorithm.weight_sync`) runs the ``learner_*`` functions below
on every learner through ``LearnerGroup.foreach_learner``; each reaches the learner's
`WeightSender`.  What is offered is the policy's HF state dict in the samplers' dtype (the
cast happens on the learner, while copying), every FSDP shard gathered in the same order on
every rank (a collective: each call runs on all learners at once); learner rank 0 sends:

* ``local``: the live tensors themselves, for the env runner in this process;
* ``shm``: rank 0 writes the weights into the node's shared weights file and answers where
  it is (`rllib_grpo.weights.shm.SharedOffer`);
* ``ipc``: one packed chunk per call, every rank's CUDA IPC buffer merged by GPU UUID
  (`rllib_grpo.weights.gpu.IpcChunks`);
* ``nccl``: rank 0 makes the group's unique id, joins the group, and broadcasts.

The object store path (and LoRA payloads, adapter-only) is RLlib's: ``get_state`` of the
learner group.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.rllib.learner.distributed import rank
from rllib_grpo.rllib.placement import fake_gpu_ids, fake_gpus, node_id, whereabouts
from rllib_grpo.weights import gpu
from rllib_grpo.weights.shm import (
    Manifest,
    SharedOffer,
    SharedWeights,
    plan_manifest,
    split_aliases,
)


def policy_module(learner: Any) -> Any:
    """The learner's `CausalLMRLModule` (unwrapped from DDP)."""
    module = learner.module[DEFAULT_MODULE_ID]
    return module.unwrapped() if hasattr(module, "unwrapped") else module


def _gathered(tensor: torch.Tensor) -> torch.Tensor:
    """A full tensor from FSDP shards (a collective over the learners); others as they are."""
    if not hasattr(tensor, "full_tensor"):
        return tensor.detach()
    mesh_device = tensor.device_mesh.device_type  # type: ignore[attr-defined]  # a DTensor
    if tensor.device.type != mesh_device:  # CPU-offloaded shards of a GPU mesh
        tensor = tensor.to(mesh_device)
    return tensor.full_tensor().detach()


class WeightSender:
    """A learner's half of weight syncs: the weights it offers and what it holds between
    calls (the shared weights file, an ``ipc`` sync's chunks, the NCCL group)."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.shared: SharedWeights | None = None
        self._manifest: tuple[tuple, Manifest] | None = None  # (layout key, manifest)
        self.ipc: gpu.IpcChunks | None = None
        self.nccl: Any = None  # rank 0's communicator

    @property
    def module(self) -> Any:
        return policy_module(self.learner)

    def _on_device(self) -> contextlib.AbstractContextManager:
        """The learner's GPU as the current device (a call may run on a thread of its own,
        which starts on device 0: vLLM's producers allocate on the current device)."""
        device = next(self.module.lm.parameters()).device
        return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()

    @property
    def seq_no(self) -> int:
        """The weights' version: learner updates done (RLlib's weights sequence number)."""
        return int(getattr(self.learner, "_weights_seq_no", 0))

    def endpoint(self) -> dict[str, Any]:
        """Where this rank's weights live: node, pid, device and GPU (where the GPUs are
        fake, the GPU Ray assigned: the planner decides as for a real one)."""
        device = next(self.module.lm.parameters()).device
        if fake_gpus():
            gpus = fake_gpu_ids(whereabouts())
        elif device.type == "cuda":
            gpus = (str(torch.cuda.get_device_properties(device).uuid),)
        else:
            gpus = ()
        return {"rank": rank(), "node_id": node_id(), "pid": os.getpid(),
                "device": "cuda" if gpus else "cpu", "gpus": gpus,
                "host_payload": self.module.lora is not None}

    # ------------------------------------------------------------------ the weights
    def _state(self) -> tuple[dict[str, torch.Tensor], tuple[tuple[str, str], ...]]:
        return split_aliases(self.module.lm.state_dict())

    def manifest(self, wire_dtype: torch.dtype | None) -> Manifest:
        """The layout of the weights in the wire dtype (planned once per layout)."""
        tensors, aliases = self._state()
        key = (tuple((n, tuple(t.shape), t.dtype) for n, t in tensors.items()), aliases,
               wire_dtype)
        if self._manifest is None or self._manifest[0] != key:
            self._manifest = (key, plan_manifest(tensors, wire_dtype, aliases))
        return self._manifest[1]

    def weights(self, wire_dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
        """``(name, full tensor in the wire dtype)``, a tied weight under each of its names
        (vLLM keeps a head it is not given): gathers shards, so every rank iterates."""
        tensors, aliases = self._state()
        aliases_of: dict[str, list[str]] = {}
        for alias, target in aliases:
            aliases_of.setdefault(target, []).append(alias)
        for name, tensor in tensors.items():
            full = _gathered(tensor)
            if wire_dtype is not None and full.is_floating_point() and full.dtype != wire_dtype:
                full = full.to(wire_dtype)
            full = full.contiguous()
            for each in (name, *aliases_of.get(name, ())):
                yield each, full

    def metadata(self, wire_dtype: torch.dtype | None) -> list[tuple[str, torch.dtype, tuple]]:
        """``(name, wire dtype, shape)`` of what `weights` yields, without gathering."""
        manifest = self.manifest(wire_dtype)
        targets = {e.name: e for e in manifest.entries}
        rows = []
        for entry in manifest.entries:
            rows.append((entry.name, getattr(torch, entry.dtype), entry.shape))
            rows += [(alias, getattr(torch, entry.dtype), entry.shape)
                     for alias, target in manifest.aliases if targets[target] is entry]
        return rows

    def local_state(self) -> Any:
        """For the env runner in this process: the live tensors (or a LoRA payload)."""
        module = self.module
        if module.lora is not None:
            return module.get_state(inference_only=True)
        return {k: v.detach() for k, v in module.lm.state_dict().items()}

    # ------------------------------------------------------------------ shm
    def offer_shared(self, wire_dtype: torch.dtype | None, stamp: int) -> SharedOffer | None:
        """Rank 0 writes the weights into the shared weights file (made, or made anew for a
        new layout, here); the other ranks gather their shards for it."""
        manifest = self.manifest(wire_dtype)
        tensors, _ = self._state()
        if rank() != 0:
            for entry in manifest.entries:
                _gathered(tensors[entry.name])
            return None
        if self.shared is None or self.shared.nbytes != manifest.nbytes:
            self.close_shared()
            self.shared = SharedWeights.create(manifest.nbytes)
        self.shared.write(manifest, lambda name: _gathered(tensors[name]), stamp)
        return SharedOffer(self.shared.path, manifest, stamp, self.seq_no)

    def close_shared(self) -> None:
        if self.shared is not None:
            self.shared.close(remove=True)
            self.shared = None

    # ------------------------------------------------------------------ ipc
    def ipc_next(self, wire_dtype: torch.dtype | None, buffer_bytes: int) -> dict | None:
        """The next packed chunk of this sync (vLLM's update info on rank 0, ``{}`` on the
        others); None when every chunk went (the next call starts a new sync)."""
        with self._on_device():
            if self.ipc is None:  # vLLM's IPC buffer takes no tensor larger than itself
                largest = max((e.nbytes for e in self.manifest(wire_dtype).entries), default=1)
                self.ipc = gpu.IpcChunks(self.weights(wire_dtype), max(buffer_bytes, largest),
                                         rank() == 0)
            info = self.ipc.next()
        if info is None:
            self.ipc = None
        return info

    # ------------------------------------------------------------------ nccl
    def nccl_unique_id(self) -> str | None:
        """Rank 0: a new group's id (the group it held before is left)."""
        self.close_nccl()
        return gpu.nccl_unique_id() if rank() == 0 else None

    def nccl_join(self, unique_id: str, world_size: int) -> None:
        if rank() == 0:
            with self._on_device():
                self.nccl = gpu.nccl_join(unique_id, world_size)

    def nccl_send(self, wire_dtype: torch.dtype | None, buffer_bytes: int) -> None:
        weights = self.weights(wire_dtype)
        if rank() != 0:
            for _ in weights:  # the gathers of this rank's shards
                pass
            return
        if self.nccl is None:
            raise RuntimeError("weight sync: learner rank 0 is in no NCCL group (nccl_join)")
        with self._on_device():
            gpu.nccl_send(self.nccl, weights, buffer_bytes)

    def close_nccl(self) -> None:
        group, self.nccl = self.nccl, None
        if group is not None:
            group.destroy()

    def close(self) -> None:
        self.close_shared()
        self.close_nccl()
        self.ipc = None


# --------------------------------------------------------------------------- the driver's calls
class SendingLearner(Protocol):
    """A learner that owns a `WeightSender` (`rllib_grpo.rllib.learner.learner.GRPOLearner`)."""

    @property
    def weight_sender(self) -> WeightSender: ...


def learner_endpoint(learner: SendingLearner) -> dict[str, Any]:
    return learner.weight_sender.endpoint()


def learner_metadata(learner: SendingLearner, wire_dtype: torch.dtype | None
                     ) -> tuple[int, list, int]:
    """``(rank, what a sync carries: name, dtype, shape; the weights' version)``."""
    sender = learner.weight_sender
    return rank(), sender.metadata(wire_dtype), sender.seq_no


def learner_module_state(learner: SendingLearner) -> tuple[int, Any, int]:
    """``(rank, the policy's state for a sync, the weights' version)``: the state dict in the
    samplers' dtype, or a LoRA payload (RLlib's ``get_state(inference_only=True)``; a
    collective under FSDP, rank 0's is whole)."""
    sender = learner.weight_sender
    return rank(), sender.module.get_state(inference_only=True), sender.seq_no


def learner_local_state(learner: SendingLearner) -> tuple[Any, int]:
    """``(the live tensors or a LoRA payload, the weights' version)``."""
    return learner.weight_sender.local_state(), learner.weight_sender.seq_no


def learner_offer_shared(learner: SendingLearner, wire_dtype: torch.dtype | None, stamp: int
                         ) -> SharedOffer | None:
    return learner.weight_sender.offer_shared(wire_dtype, stamp)


def learner_ipc_next(learner: SendingLearner, wire_dtype: torch.dtype | None,
                     buffer_bytes: int) -> tuple[int, dict | None]:
    """``(rank, the next chunk's update info, None once all went)``."""
    return rank(), learner.weight_sender.ipc_next(wire_dtype, buffer_bytes)


def learner_nccl_unique_id(learner: SendingLearner) -> str | None:
    return learner.weight_sender.nccl_unique_id()


def learner_nccl_join(learner: SendingLearner, unique_id: str, world_size: int) -> None:
    learner.weight_sender.nccl_join(unique_id, world_size)


def learner_nccl_send(learner: SendingLearner, wire_dtype: torch.dtype | None,
                      buffer_bytes: int) -> None:
    learner.weight_sender.nccl_send(wire_dtype, buffer_bytes)


def learner_close(learner: SendingLearner) -> None:
    learner.weight_sender.close()
