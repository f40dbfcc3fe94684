"""What travels through vLLM's weight-transfer control plane for our own engines, and the
receiving half they share (no vLLM import here: the transformers sampler uses it too).

vLLM's API (``vllm.distributed.weight_transfer``) drives every sync the same way:
``init_weight_transfer_engine(init_info)`` once per group, then per sync
``start_weight_update()``, ``update_weights(update_info)``, ``finish_weight_update()``.
The dicts here are the ``init_info`` / ``update_info`` of our engines:

* ``grpo_shm`` / ``grpo_gloo`` (dense, host memory): init = a gloo group's rendezvous
  (`GroupInit`), update = the bucket manifest (`BucketUpdate`: names, shapes, dtypes,
  offsets, tied aliases) plus, for ``grpo_shm``, the shared-memory slots.
* ``grpo_sparse_gloo`` (delta): vLLM's ``sparse_nccl`` wire format over a gloo group
  (`SparseUpdate` has the fields of vLLM's ``SparseNCCLWeightTransferUpdateInfo``; per
  tensor an int32 index vector and a value vector are broadcast), with one addition: a
  tensor whose ``num_updates`` equals its element count travels dense, its values in
  order and no indices (the sender does so wherever that is fewer bytes; vLLM's format
  has no dense form, so a tensor with most elements changed would cost more than a full
  sync there: 4 + itemsize bytes per element).

``grpo`` is the engine every vLLM sampler is created with (the backend is fixed when the
engine starts, the transport only when the driver has seen the placement): its init info
names the real backend (`DispatchInit`), and it creates that engine through vLLM's factory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

import torch

from rllib_grpo.weights.layout import Bucket, Entry, Manifest, _itemsize
from rllib_grpo.weights.transport import (
    VIA_COLLECTIVE,
    VIA_SHM,
    BucketReceiver,
    GroupSpec,
    SlotsSpec,
)

DISPATCH_BACKEND = "grpo"
SHM_BACKEND, GLOO_BACKEND, SPARSE_GLOO_BACKEND = "grpo_shm", "grpo_gloo", "grpo_sparse_gloo"
HOST_BACKENDS = (SHM_BACKEND, GLOO_BACKEND, SPARSE_GLOO_BACKEND)  # ours, host memory
VLLM_BACKENDS = ("nccl", "ipc")  # vLLM's own, GPU only (its sparse_nccl: see engines.py)
# The trainer side of ``nccl``: vLLM's NCCL trainer engine on a port bound before the
# receivers are told of it (`rllib_grpo.weights.engines.NcclTrainerEngine`); the receivers
# run vLLM's own ``nccl`` engine.
NCCL_TRAINER_BACKEND = "grpo_nccl"
SPARSE_BACKENDS = (SPARSE_GLOO_BACKEND,)
GROUP_BACKENDS = (SHM_BACKEND, GLOO_BACKEND, SPARSE_GLOO_BACKEND, "nccl")


@dataclass
class DispatchInit:
    """``init_info`` of the ``grpo`` engine: the backend to create and its own init info."""

    backend: str
    init_info: dict


@dataclass
class GroupInit:
    """``init_info`` of our group engines: a gloo group's rendezvous; worker ``r`` of an
    engine joins as rank ``rank_offset + r`` (vLLM's rule for its NCCL engines)."""

    host: str
    port: int
    world_size: int
    token: str
    rank_offset: int = 1
    timeout_s: float = 300.0

    def spec(self) -> GroupSpec:
        return GroupSpec(self.host, self.port, self.world_size, "gloo", self.token,
                         self.timeout_s)

    @classmethod
    def of(cls, spec: GroupSpec, rank_offset: int = 1) -> GroupInit:
        return cls(spec.host, spec.port, spec.world_size, spec.token, rank_offset,
                   spec.timeout_s)


@dataclass
class BucketUpdate:
    """``update_info`` of ``grpo_shm`` / ``grpo_gloo``: the manifest (`manifest_to_wire`)
    and, for shared memory, the slot files and their size."""

    manifest: dict
    slots: list[str] | None = None
    slot_bytes: int = 0


@dataclass
class SparseUpdate:
    """``update_info`` of ``grpo_sparse_gloo``: vLLM's ``sparse_nccl`` fields."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    num_updates_list: list[int]

    def __post_init__(self) -> None:
        if not len(self.names) == len(self.dtype_names) == len(self.shapes) \
                == len(self.num_updates_list):
            raise ValueError("sparse update: names, dtype_names, shapes and num_updates_list "
                             "must have one entry per tensor")


class Patch(NamedTuple):
    """One tensor's changed elements, in the field order of vLLM's ``CheckpointWeightPatch``
    (flat int32 ``indices`` into a tensor of ``shape``; None: ``values`` is the whole
    tensor)."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    values: torch.Tensor
    indices: torch.Tensor | None


def apply_patch(target: torch.Tensor, patch: Patch) -> None:
    """Write ``patch`` into ``target`` (a tensor of the patch's shape, any device/dtype)."""
    values = patch.values.to(device=target.device, dtype=target.dtype)
    if patch.indices is None:
        target.copy_(values.view(target.shape))
    else:
        target.view(-1)[patch.indices.long().to(target.device)] = values


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).split(".")[-1]


def manifest_to_wire(manifest: Manifest) -> dict:
    """A manifest as plain lists and strings (it rides a control-plane call)."""
    return {"buckets": [[dtype_name(b.dtype), b.numel,
                         [[e.name, list(e.shape), e.offset, e.numel, e.direct] for e in b.entries]]
                        for b in manifest.buckets],
            "aliases": [list(a) for a in manifest.aliases], "partial": manifest.partial}


def manifest_from_wire(wire: dict) -> Manifest:
    buckets = tuple(Bucket(getattr(torch, dtype), numel,
                           tuple(Entry(name, tuple(shape), offset, n, direct)
                                 for name, shape, offset, n, direct in entries))
                    for dtype, numel, entries in wire["buckets"])
    return Manifest(buckets, tuple((a, t) for a, t in wire["aliases"]), wire["partial"])


def update_nbytes(update_info: dict) -> int:
    """Bytes one receiver takes for ``update_info`` (any of our engines' or vLLM's)."""
    if "manifest" in update_info:
        return sum(_itemsize(getattr(torch, dtype)) * numel
                   for dtype, numel, _ in update_info["manifest"]["buckets"])
    sizes = [_itemsize(getattr(torch, d)) for d in update_info.get("dtype_names", ())]
    if "num_updates_list" in update_info:  # int32 index + value per element, or dense
        return sum(n * s + (0 if n == math.prod(shape) else 4 * n) for n, s, shape in zip(
            update_info["num_updates_list"], sizes, update_info["shapes"], strict=True))
    return sum(math.prod(shape) * s for shape, s in zip(update_info.get("shapes", ()), sizes,
                                                         strict=True))


class HostReceiver:
    """The receiving half of our engines, in a vLLM worker or a transformers sampler: a gloo
    group member that streams dense buckets or sparse patches."""

    def __init__(self) -> None:
        self.buckets = BucketReceiver()

    @property
    def token(self) -> str | None:
        return self.buckets.token

    def init(self, init_info: dict | GroupInit, worker_rank: int = 0) -> None:
        info = init_info if isinstance(init_info, GroupInit) else GroupInit(**init_info)
        self.buckets.join(info.spec(), info.rank_offset + worker_rank)

    def stream(self, update_info: dict | BucketUpdate,
               homes: list[torch.Tensor | None] | None = None
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """The buckets of one update as ``(name, tensor)``: through the shared-memory slots
        the update names (``grpo_shm``), else broadcast (``grpo_gloo``)."""
        info = update_info if isinstance(update_info, BucketUpdate) else BucketUpdate(**update_info)
        if info.slots:
            self.buckets.map_slots(SlotsSpec(tuple(info.slots), info.slot_bytes))
        via = VIA_SHM if info.slots else VIA_COLLECTIVE
        return self.buckets.stream(manifest_from_wire(info.manifest), via, homes=homes)

    def patches(self, update_info: dict | SparseUpdate) -> list[Patch]:
        """Receive each tensor's int32 indices and its values (vLLM's sparse order), or
        its values alone where they are the whole tensor."""
        info = update_info if isinstance(update_info, SparseUpdate) else SparseUpdate(**update_info)
        group = self.buckets._group()
        out = []
        for name, dtype, shape, n in zip(info.names, info.dtype_names, info.shapes,
                                         info.num_updates_list, strict=True):
            indices = None if n == math.prod(shape) else torch.empty(n, dtype=torch.int32)
            values = torch.empty(n, dtype=getattr(torch, dtype))
            if indices is not None:
                group.broadcast(indices).wait()
            group.broadcast(values).wait()
            out.append(Patch(name, tuple(shape), values.dtype, values, indices))
        return out

    def close(self) -> None:
        self.buckets.close()


def as_dict(info: Any) -> dict:
    """A dataclass info as the dict vLLM's control plane carries."""
    return asdict(info)
