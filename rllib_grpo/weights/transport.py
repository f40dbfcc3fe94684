"""Host-memory data paths of our own weight-transfer engines (no Ray, no vLLM here): the
``grpo_shm``/``grpo_gloo``/``grpo_sparse_gloo`` engines of `rllib_grpo.weights.engines`
(registered with vLLM's ``WeightTransferEngineFactory``) move their bytes with these.  GPU
paths are vLLM's own engines (``nccl``, ``ipc``, ``sparse_nccl``); nothing here touches CUDA.

* ``collective``: a gloo `torch.distributed` group of its own (never the default group,
  which the learners or vLLM may own), rank 0 the sender.  Buckets are broadcast one after
  the other through two buffers per side: the sender packs bucket k+1 while bucket k
  travels, a receiver loads bucket k while k+1 arrives.
* ``shm``: the same group for signalling only; the bytes go through two shared-memory
  slots (files in ``/dev/shm`` mapped by every process on the node): the sender packs
  bucket k into slot k % 2, one barrier, the receivers load it from there.

A weight group is shut down (`WeightGroup.close`: the connections, the store) whenever its
owner closes or joins a new one.  `BucketSender.send` and `BucketReceiver.stream` are the
two halves; the receiver yields views of its buffers, no copies; a view the consumer still
holds when it asks for the next bucket is given memory of its own first.
"""

from __future__ import annotations

import contextlib
import datetime
import mmap
import os
import socket
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rllib_grpo.weights.layout import Manifest, pack_bucket, typed

VIA_COLLECTIVE, VIA_SHM = "collective", "shm"
NUM_SLOTS = 2  # double buffering


# --------------------------------------------------------------------------- group
@dataclass(frozen=True)
class GroupSpec:
    """Where and how to join a weight group; ``token`` names this generation of it."""

    host: str
    port: int
    world_size: int
    backend: str
    token: str
    timeout_s: float = 300.0


def open_store(host: str, world_size: int, backend: str, timeout_s: float = 300.0
               ) -> tuple[dist.TCPStore, GroupSpec]:
    """The sender's rendezvous store on a free port, and the spec receivers join with."""
    store = dist.TCPStore(host, 0, world_size, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    return store, GroupSpec(host, int(store.port), world_size, backend, uuid.uuid4().hex,
                            timeout_s)


# A rendezvous step with a deadline of its own (the host engines' wait for the joiners)
# has this long past the deadline to raise its error, which names the missing ranks,
# before `rllib_grpo.weights.trainer.connect` gives up with its own.
JOIN_GRACE_S = 1.0


def did_not_join(who: str, group: str, timeout_s: float,
                 address: tuple[str, int] | None = None) -> TimeoutError:
    """The one-line error of a weight group that did not form within ``timeout_s``: who
    did not join, where (the rendezvous ``address``: host, port), and what opens the way.
    ``group``: whose connections follow the rendezvous (``"NCCL"``, ``"gloo"``)."""
    if address is None:
        where, fix = "", "check that they are alive and not busy"
    else:
        host, port = address
        where = f" at {host}:{port}"
        fix = f"open TCP port {port} (and {group}'s ports) between the nodes"
    return TimeoutError(f"weight sync: {who} did not join the {group} group{where} within "
                        f"{timeout_s:g} s: {fix}, or set weight_sync_transport='object_store'")


def wait_for_members(store: dist.Store, spec: GroupSpec, joining: Any,
                     who: Callable[[list[int]], str] | None = None,
                     poll_s: float = 0.05) -> None:
    """Rank 0, before its own rendezvous: wait until ranks 1.. have reached the store,
    raising at once the error of a failed join (``joining``: a future) and, after
    ``spec.timeout_s``, `did_not_join` naming the ranks that never arrived (``who``
    describes them, e.g. as the env runners holding them), instead of waiting in gloo's
    rendezvous (``TCPStore::doWait``) with no word of why."""
    prefixed = dist.PrefixStore(f"rllib_grpo/weights/{spec.token}", store)
    keys = [f"arrived/{r}" for r in range(1, spec.world_size)]
    deadline = time.monotonic() + spec.timeout_s
    while not prefixed.check(keys):
        if joining.done():
            joining.result()  # a join that failed raises its own error here
            if prefixed.check(keys):
                break
            missing = [r for r, k in enumerate(keys, 1) if not prefixed.check([k])]
            raise RuntimeError(f"weight group at {spec.host}:{spec.port}: the joiners "
                               f"returned but ranks {missing} never reached the store")
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys, 1) if not prefixed.check([k])]
            raise did_not_join(who(missing) if who else f"ranks {missing}", "gloo",
                               spec.timeout_s, (spec.host, spec.port))
        time.sleep(poll_s)


def on_daemon_thread(func: Callable[..., Any], *args: Any) -> Future:
    """``func(*args)`` on a daemon thread: the receivers' side of a rendezvous, which
    blocks until they have joined.  One stuck past the deadline must hold neither the
    sender nor, at exit, the process (an executor's threads are joined then)."""
    future: Future = Future()

    def run() -> None:
        try:
            future.set_result(func(*args))
        except BaseException as error:  # noqa: BLE001 - handed to the future's reader
            future.set_exception(error)

    threading.Thread(target=run, name="weight_group_join", daemon=True).start()
    return future


def listening_socket(host: str) -> socket.socket:
    """A TCP socket listening on ``host`` at a port the system picks: the side that
    listens binds first, so the port it tells the others is one it holds (a port found
    free and closed again can be taken by another process before the real bind)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, 0))
        listener.listen()
    except OSError:
        listener.close()
        raise
    return listener


class WeightGroup:
    """A standalone gloo process group (not the default one) for weight syncs; rank 0
    sends.  NCCL groups are vLLM's (``nccl``/``sparse_nccl`` engines), not ours."""

    def __init__(self, spec: GroupSpec, rank: int, store: dist.Store | None = None) -> None:
        timeout = datetime.timedelta(seconds=spec.timeout_s)
        if store is None:
            store = dist.TCPStore(spec.host, spec.port, spec.world_size, is_master=False,
                                  timeout=timeout)
        self._store: dist.Store | None = store  # keep the connection alive with the group
        prefixed = dist.PrefixStore(f"rllib_grpo/weights/{spec.token}", store)
        prefixed.set(f"arrived/{rank}", "1")  # the sender's `wait_for_members` sees it
        self.spec, self.rank = spec, rank
        if spec.backend != "gloo":
            raise ValueError(f"weight group backend {spec.backend!r}: our groups are gloo "
                             "(NCCL transfers go through vLLM's nccl/sparse_nccl engines)")
        self.pg: Any = dist.ProcessGroupGloo(prefixed, rank, spec.world_size, timeout)
        self.device = torch.device("cpu")
        self._flag = torch.zeros(1, device=self.device)

    def _pg(self) -> Any:
        if self.pg is None:
            raise RuntimeError(f"weight group {self.spec.token[:8]} is closed")
        return self.pg

    def broadcast(self, tensor: torch.Tensor) -> Any:
        """Start broadcasting ``tensor`` from rank 0; returns the work to wait on."""
        options = dist.BroadcastOptions()
        options.rootRank = 0
        return self._pg().broadcast([tensor], options)

    def barrier(self) -> None:
        self._pg().allreduce([self._flag]).wait()

    def close(self) -> None:
        """Shut the group down: gloo's connections, then the store (the sender's: its
        listening port).  Idempotent."""
        pg, self.pg = self.pg, None
        if pg is not None:
            pg.shutdown()
        self._store = None


# --------------------------------------------------------------------------- shared memory
@dataclass(frozen=True)
class SlotsSpec:
    """Shared-memory slots of ``nbytes`` each, by file path."""

    paths: tuple[str, ...]
    nbytes: int


def _shm_dir() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


class SharedSlots:
    """Files mapped into memory as uint8 tensors: created by the sender, mapped by receivers.

    The sender unlinks the files once every receiver has mapped them (`unlink`): the
    mappings live on, and nothing is left behind if a process dies.
    """

    def __init__(self, spec: SlotsSpec, create: bool = False) -> None:
        self.spec = spec
        self._maps: list[mmap.mmap] = []
        self.tensors: list[torch.Tensor] = []
        for path in spec.paths:
            flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
            fd = os.open(path, flags, 0o600)
            try:
                if create:
                    os.ftruncate(fd, spec.nbytes)
                mapped = mmap.mmap(fd, spec.nbytes)
            finally:
                os.close(fd)
            self._maps.append(mapped)
            self.tensors.append(torch.frombuffer(mapped, dtype=torch.uint8))

    @classmethod
    def create(cls, nbytes: int, count: int = NUM_SLOTS) -> SharedSlots:
        stem = os.path.join(_shm_dir(), f"rllib_grpo_weights_{os.getpid()}_{uuid.uuid4().hex}")
        return cls(SlotsSpec(tuple(f"{stem}_{i}" for i in range(count)), nbytes), create=True)

    def unlink(self) -> None:
        for path in self.spec.paths:
            if os.path.exists(path):
                os.unlink(path)

    def close(self) -> None:
        self.unlink()
        self.tensors.clear()  # the tensors borrow the maps' memory: drop them first
        for mapped in self._maps:
            try:
                mapped.close()
            except BufferError:  # a view is still alive somewhere; the OS frees it at exit
                pass
        self._maps.clear()


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """torch's intra-op threads of the calling thread set to one, then back.

    On a 2-core machine the sender's two packing threads slowed every receiver's copy of
    the bucket before (a remote runner's 104 MiB sync, in turns: 44-49 ms with two, 28-40 ms
    with one; benchmarks/README.md, "A remote runner's sync (2026-12-04)").  OpenMP's thread count and
    MKL's (``mkl_set_num_threads_local``) are the calling thread's own, so a learner working
    in another thread keeps its threads."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# --------------------------------------------------------------------------- the two halves
def _views_kept_safe(bucket: Any, buffer: torch.Tensor, aliases_of: dict[str, list[str]]
                     ) -> Iterator[tuple[str, torch.Tensor]]:
    """A bucket's named views; once the consumer moves past the bucket, the views it still
    holds get memory of their own, so the buffer can take the next bucket.

    vLLM's layer-wise reload keeps the tensors of a layer until the layer is complete and
    some (the tied embeddings) until the very end; a transformers sampler keeps none.
    """
    views = [buffer.narrow(0, e.offset, e.numel).view(e.shape) for e in bucket.entries]
    for i, entry in enumerate(bucket.entries):
        yield entry.name, views[i]
        for alias in aliases_of.get(entry.name, ()):
            yield alias, views[i]
    for i in range(len(views)):
        if sys.getrefcount(views[i]) > 2:  # more than this list and the call's argument
            views[i].set_(views[i].clone())  # type: ignore[call-overload]


class _GroupMember:
    """What both ends of a weight group hold: the group, the shared-memory slots and two
    reusable bucket buffers on the group's device."""

    def __init__(self, group: WeightGroup | None = None) -> None:
        self.group = group
        self.slots: SharedSlots | None = None
        self._buffers: list[torch.Tensor] = []

    def _group(self) -> WeightGroup:
        if self.group is None:
            raise RuntimeError(f"{type(self).__name__}: not in a weight group (closed, or "
                               "never joined)")
        return self.group

    def _slots(self) -> SharedSlots:
        if self.slots is None:
            raise RuntimeError(f"{type(self).__name__}: no shared-memory slots mapped yet")
        return self.slots

    def _buffer(self, i: int, nbytes: int) -> torch.Tensor:
        device = self._group().device
        while len(self._buffers) <= i:
            self._buffers.append(torch.empty(0, dtype=torch.uint8, device=device))
        if self._buffers[i].numel() < nbytes:
            self._buffers[i] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return self._buffers[i]


class BucketSender(_GroupMember):
    """Rank 0 of a weight group: streams a manifest's buckets by broadcast or through slots."""

    def ensure_slots(self, nbytes: int) -> SlotsSpec:
        """Shared-memory slots of at least ``nbytes`` (new files when they grow)."""
        if self.slots is None or self.slots.spec.nbytes < nbytes:
            if self.slots is not None:
                self.slots.close()
            self.slots = SharedSlots.create(nbytes)
        return self.slots.spec

    def send(self, manifest: Manifest, tensor_of: Callable[[str], torch.Tensor], via: str
             ) -> None:
        """Stream every bucket; returns when the last one is out (``shm``: in its slot)."""
        if via == VIA_SHM:
            # Packing bucket k+1 overlaps the receivers' copies of bucket k, in processes
            # of their own: one packing thread leaves them the other cores.
            with one_torch_thread():
                for k, bucket in enumerate(manifest.buckets):
                    pack_bucket(bucket, tensor_of,
                                typed(self._slots().tensors[k % NUM_SLOTS], bucket))
                    self._group().barrier()  # receivers are past bucket k-1: slot (k+1) % 2 is free
            return
        if via != VIA_COLLECTIVE:
            raise ValueError(f"BucketSender cannot send via {via!r}")
        group = self._group()
        works: list[list] = [[], []]  # per buffer: the ops in flight and what they send
        for k, bucket in enumerate(manifest.buckets):
            i = k % NUM_SLOTS
            for work, _ in works[i]:
                work.wait()
            buffer = typed(self._buffer(i, manifest.max_bucket_bytes), bucket)
            works[i] = []
            if bucket.packed:
                for e in bucket.packed:
                    buffer.narrow(0, e.offset, e.numel).view(e.shape).copy_(tensor_of(e.name))
                payload = buffer[: bucket.packed_used]
                works[i].append((group.broadcast(payload), payload))
            for e in bucket.direct:  # from where it lies: no copy into the bucket
                payload = self._source(tensor_of(e.name), buffer.narrow(0, e.offset, e.numel))
                works[i].append((group.broadcast(payload), payload))
        for ops in works:
            for work, _ in ops:
                work.wait()

    def _source(self, tensor: torch.Tensor, place: torch.Tensor) -> torch.Tensor:
        """``tensor`` flat as it is, or copied into ``place`` where it cannot be sent so."""
        tensor = tensor.detach()
        if (tensor.dtype == place.dtype and tensor.is_contiguous()
                and tensor.device == self._group().device):
            return tensor.reshape(-1)
        return place.copy_(tensor.reshape(-1))

    def close(self) -> None:
        if self.slots is not None:
            self.slots.close()
        if self.group is not None:
            self.group.close()
        self.slots, self.group, self._buffers = None, None, []


class BucketReceiver(_GroupMember):
    """A receiving rank: joins the group, maps the slots, streams ``(name, tensor)``."""

    def join(self, spec: GroupSpec, rank: int) -> None:
        self.close()
        self.group = WeightGroup(spec, rank)

    @property
    def token(self) -> str | None:
        return None if self.group is None else self.group.spec.token

    def map_slots(self, spec: SlotsSpec) -> None:
        if self.slots is None or self.slots.spec != spec:
            if self.slots is not None:
                self.slots.tensors.clear()
            self.slots = SharedSlots(spec)

    def stream(self, manifest: Manifest, via: str,
               homes: list[torch.Tensor | None] | None = None
               ) -> Iterator[tuple[str, torch.Tensor]]:
        """The manifest's tensors (and aliases) as they arrive.  ``homes`` (collective
        only): per bucket, memory to receive it into, e.g. the very parameters it fills."""
        aliases_of = manifest.aliases_of()
        if via == VIA_SHM:
            for k, bucket in enumerate(manifest.buckets):
                self._group().barrier()  # the sender has packed bucket k
                yield from _views_kept_safe(
                    bucket, typed(self._slots().tensors[k % NUM_SLOTS], bucket), aliases_of)
            return
        if via != VIA_COLLECTIVE:
            raise ValueError(f"BucketReceiver cannot receive via {via!r}")
        group = self._group()
        buckets = manifest.buckets
        works: list[list[Any]] = [[], []]

        def post(k: int) -> torch.Tensor:
            """Start receiving bucket k: its packed part, then each direct entry."""
            home, bucket = (homes[k] if homes else None), buckets[k]
            buffer = home if home is not None and home.device == group.device else typed(
                self._buffer(k % NUM_SLOTS, manifest.max_bucket_bytes), bucket)
            parts = [buffer[: bucket.packed_used]] if bucket.packed else []
            parts += [buffer.narrow(0, e.offset, e.numel) for e in bucket.direct]
            works[k % NUM_SLOTS] = [group.broadcast(part) for part in parts]
            return buffer

        posted: list[torch.Tensor | None] = [post(0)] if buckets else []
        for k, bucket in enumerate(buckets):
            if k + 1 < len(buckets):  # two in flight; its buffer held bucket k-1, done with
                posted.append(post(k + 1))
            for work in works[k % NUM_SLOTS]:
                work.wait()
            received = posted[k]
            posted[k] = None  # the buffer is free for bucket k + 2
            assert received is not None
            yield from _views_kept_safe(bucket, received, aliases_of)
            del received

    def close(self) -> None:
        if self.slots is not None:
            self.slots.tensors.clear()
        if self.group is not None:
            self.group.close()
        self.group, self.slots, self._buffers = None, None, []
