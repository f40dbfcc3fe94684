"""The learners' side of vLLM's weight-transfer engines on GPUs (``ipc``, ``nccl``); the env
runners' engines are vLLM's own (``IPCWeightTransferEngine``, ``NCCLWeightTransferEngine``)
and take vLLM's init and update infos, built here as dicts.

* ``ipc`` (an engine whose ranks share the learners' GPUs, verl's colocated layout): every
  learner rank packs the same chunk of the weights into a reusable buffer on its own GPU
  (vLLM's ``packed_ipc_producer``); the ranks' CUDA IPC handles are gathered and merged by
  GPU UUID (`merge_ipc_handles`), so each engine worker opens the buffer on its own GPU.
  This is what vLLM's IPC trainer engine does for FSDP trainers, one chunk per round of the
  driver: it asks for the next chunk (`IpcChunks.next`) only once every receiver has loaded
  the last, so the buffer is free to take it.
* ``nccl`` (engines on GPUs of their own, on this node or others): one NCCL group of learner
  rank 0 and every engine worker, formed from an ``ncclUniqueId`` that rank 0 makes
  (`nccl_unique_id`: NCCL's own bootstrap, no port to pick and race for); every member
  joins at once and the driver waits with a deadline.  Per sync rank 0 broadcasts with
  vLLM's ``packed_nccl_broadcast_producer`` (`nccl_send`) while the workers receive with
  vLLM's consumer; the other learner ranks only take part in the gathers of their shards.

No vLLM import at module level: a CPU run never loads it.
"""

from __future__ import annotations

import base64
import socket
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist

PACKED_NUM_BUFFERS = 2  # vLLM's default: double buffering on both sides


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def metadata_info(metadata: Iterable[tuple[str, torch.dtype, tuple[int, ...]]]) -> dict:
    """vLLM's per-round parameter metadata (``names``, ``dtype_names``, ``shapes``)."""
    rows = list(metadata)
    return {"names": [n for n, _, _ in rows], "dtype_names": [dtype_name(d) for _, d, _ in rows],
            "shapes": [list(s) for _, _, s in rows]}


# --------------------------------------------------------------------------- ipc
def ipc_init_info() -> dict:
    """``IPCWeightTransferInitInfo``: the transfer is packed (both sides must agree)."""
    return {"packed": True}


def gather_objects(obj: Any) -> list[Any]:
    """``obj`` of every learner rank, in rank order (the learners' default process group;
    ``[obj]`` without one)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def merge_ipc_handles(per_rank: list[dict[str, tuple]]) -> dict[str, tuple]:
    """One ``{GPU UUID: rebuild args}`` from every learner rank's own: each engine worker
    looks its GPU up in it.  Two ranks on one GPU would leave a worker two buffers."""
    merged: dict[str, tuple] = {}
    for handles in per_rank:
        for gpu, args in handles.items():
            if gpu in merged:
                raise ValueError(f"two learner ranks offer CUDA IPC buffers on GPU {gpu}")
            merged[gpu] = args
    return merged


class IpcChunks:
    """The packed chunks of one ``ipc`` sync on one learner rank: each `next` packs the
    next chunk into this rank's buffer (a collective over the learners: the gathers of
    FSDP shards and of the handles) and returns vLLM's update info on rank 0."""

    def __init__(self, weights: Iterator[tuple[str, torch.Tensor]], buffer_bytes: int,
                 is_sender: bool) -> None:
        from vllm.distributed.weight_transfer.packed_tensor import packed_ipc_producer

        device = torch.cuda.current_device()
        self.gpu = str(torch.cuda.get_device_properties(device).uuid)
        self.is_sender = is_sender
        self._chunks = packed_ipc_producer(iterator=weights, gpu_uuid=self.gpu,
                                           post_iter_func=lambda item: item[1],
                                           buffer_size_bytes=buffer_bytes)

    def next(self) -> dict | None:
        """vLLM's ``IPCWeightTransferUpdateInfo`` of the next chunk (rank 0; others ``{}``),
        or None once every chunk went (the buffer is then released)."""
        chunk = next(self._chunks, None)
        handles = gather_objects(None if chunk is None else chunk.ipc_handle)
        if chunk is None:
            torch.cuda.ipc_collect()
            return None
        if not self.is_sender:
            return {}
        return {"names": chunk.names, "dtype_names": chunk.dtype_names, "shapes": chunk.shapes,
                "ipc_handles": merge_ipc_handles(handles), "tensor_sizes": chunk.tensor_sizes}


# --------------------------------------------------------------------------- nccl
def nccl_unique_id() -> str:
    """A new ``ncclUniqueId`` (base64): NCCL's bootstrap root listens in this process."""
    from vllm.distributed.device_communicators.pynccl_wrapper import NCCLLibrary

    return base64.b64encode(bytes(NCCLLibrary().ncclGetUniqueId().internal)).decode()


def nccl_bootstrap_address(unique_id: str) -> str:
    """``host:port`` where learner 0's NCCL bootstrap listens, read from the unique id
    (NCCL's ``ncclBootstrapHandle``: an 8-byte magic, then a ``sockaddr_in``/``_in6``);
    "learner 0's node" where the id holds no address NCCL would write."""
    try:
        raw = base64.b64decode(unique_id)
    except ValueError:  # binascii.Error: not an id NCCL wrote
        raw = b""
    family = int.from_bytes(raw[8:10], "little") if len(raw) >= 28 else 0
    port = int.from_bytes(raw[10:12], "big") if family else 0
    if family == socket.AF_INET:
        return f"{socket.inet_ntop(socket.AF_INET, raw[12:16])}:{port}"
    if family == socket.AF_INET6 and len(raw) >= 36:
        return f"[{socket.inet_ntop(socket.AF_INET6, raw[16:32])}]:{port}"
    return "learner 0's node"


def nccl_init_info(unique_id: str, rank_offset: int, world_size: int,
                   buffer_bytes: int) -> dict:
    """``NCCLWeightTransferInitInfo`` of one engine: its workers join as ranks
    ``rank_offset ..`` of the group, packed as the learner sends."""
    return {"nccl_unique_id_b64": unique_id, "rank_offset": rank_offset,
            "world_size": world_size, "packed": True, "packed_buffer_size_bytes": buffer_bytes,
            "packed_num_buffers": PACKED_NUM_BUFFERS}


def nccl_join(unique_id: str, world_size: int) -> Any:
    """Learner rank 0's communicator (rank 0 of the group, on this process's GPU)."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator

    return PyNcclCommunicator.from_unique_id_bytes(
        base64.b64decode(unique_id), rank=0, world_size=world_size,
        device=torch.cuda.current_device())


def nccl_send(group: Any, weights: Iterator[tuple[str, torch.Tensor]],
              buffer_bytes: int) -> None:
    """Broadcast the weights, packed, from rank 0; returns once they are out."""
    from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

    packed_nccl_broadcast_producer(iterator=weights, group=group, src=0,
                                   post_iter_func=lambda item: item[1],
                                   buffer_size_bytes=buffer_bytes,
                                   num_buffers=PACKED_NUM_BUFFERS)
    torch.cuda.current_stream().synchronize()
