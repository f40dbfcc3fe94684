"""The trainer side of weight syncs through vLLM's weight-transfer API.

A learner gets its trainer engine from vLLM's ``WeightTransferTrainerFactory.trainer_init``
(`connect`): vLLM's own ``nccl`` / ``ipc`` engines on GPUs, ours
(`ShmTrainerEngine`, `GlooTrainerEngine`, `SparseGlooTrainerEngine`, registered with the
same factory by `rllib_grpo.weights.engines.register_engines`) in host memory.  Every
engine drives the receivers through a ``VLLMWeightSyncClient`` (four calls: init, start,
update, finish); ours follow vLLM's engines call for call (the update runs on a side
thread while the trainer sends, as vLLM's NCCL engine does).

What is sent comes from a `ManifestSource`: vLLM's ``WeightSource`` contract (``metadata``
and a fresh iteration per round, FSDP shards gathered in the same order on every rank) over
our bucket layout, in the sampler's dtype, tied weights once (aliases follow their tensor
for vLLM's engines, which have no aliases).  Delta syncs send the patches of
`rllib_grpo.weights.delta.DeltaTracker`.

No vLLM import at module level: our engines and sources are plain classes (vLLM's API is
structural), so an install without vLLM still syncs a transformers sampler.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, ClassVar, NamedTuple

import torch

from rllib_grpo.weights.delta import SparsePatch
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import (
    VIA_COLLECTIVE,
    VIA_SHM,
    BucketSender,
    WeightGroup,
    open_store,
    wait_for_members,
)
from rllib_grpo.weights.wire import (
    GLOO_BACKEND,
    SHM_BACKEND,
    SPARSE_GLOO_BACKEND,
    BucketUpdate,
    GroupInit,
    SparseUpdate,
    as_dict,
    dtype_name,
    manifest_to_wire,
)


class ParamMeta(NamedTuple):
    """vLLM's ``ParamMeta`` fields: name, wire dtype, full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]


class ManifestSource:
    """A ``WeightSource`` over a manifest: what the learner sends this round."""

    def __init__(self, manifest: Manifest, tensor_of: Callable[[str], torch.Tensor]) -> None:
        self.manifest = manifest
        self.tensor_of = tensor_of  # gathers an FSDP shard: call in manifest order on all ranks

    def tensor(self, name: str) -> torch.Tensor:
        return self.tensor_of(name)

    def _wire(self, bucket_dtype: torch.dtype, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.dtype == bucket_dtype else tensor.to(bucket_dtype)

    def metadata(self) -> list[ParamMeta]:
        aliases = self.manifest.aliases_of()
        return [ParamMeta(name, b.dtype, e.shape) for b in self.manifest.buckets
                for e in b.entries for name in (e.name, *aliases.get(e.name, ()))]

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        aliases = self.manifest.aliases_of()
        for bucket in self.manifest.buckets:
            for entry in bucket.entries:
                tensor = self._wire(bucket.dtype, self.tensor_of(entry.name))
                yield entry.name, tensor
                for alias in aliases.get(entry.name, ()):
                    yield alias, tensor

    def held_names(self) -> None:
        return None

    def replay(self) -> None:
        """Gather every tensor in order without sending (FSDP ranks other than 0)."""
        for bucket in self.manifest.buckets:
            for entry in bucket.entries:
                self.tensor_of(entry.name)


# --------------------------------------------------------------------------- our engines
@dataclass
class HostTrainerInit:
    """Trainer init info of our engines (vLLM's ``TrainerInitInfo`` contract: ``backend``
    selects the engine, ``rank`` 0 sends): the gloo group's host and size."""

    backend: ClassVar[str] = GLOO_BACKEND
    host: str
    world_size: int
    timeout_s: float = 300.0
    rank: int = field(default=0, kw_only=True)

    @property
    def is_sender(self) -> bool:
        return self.rank == 0


@dataclass
class ShmTrainerInit(HostTrainerInit):
    backend: ClassVar[str] = SHM_BACKEND


@dataclass
class SparseGlooTrainerInit(HostTrainerInit):
    backend: ClassVar[str] = SPARSE_GLOO_BACKEND


class _HostTrainerEngine:
    """Rank 0 of a gloo group with the receivers (vLLM's trainer-engine contract)."""

    def __init__(self, *, client: Any, source: Any = None, is_sender: bool = True) -> None:
        self.client, self.source, self.is_sender = client, source, is_sender
        self.sender = BucketSender()

    @classmethod
    def trainer_init(cls, init_info: HostTrainerInit, *, client: Any, source: Any = None
                     ) -> Any:
        """The receivers join (``client.init_weight_transfer_engine`` on a side thread)
        while the sender opens the group as rank 0."""
        engine = cls(client=client, source=source, is_sender=init_info.is_sender)
        if not engine.is_sender:
            return engine
        store, spec = open_store(init_info.host, init_info.world_size, "gloo",
                                 init_info.timeout_s)
        pool = ThreadPoolExecutor(max_workers=1)
        joining = pool.submit(client.init_weight_transfer_engine,
                              as_dict(GroupInit.of(spec, rank_offset=1)))
        try:
            wait_for_members(store, spec, joining)  # a clear error, never a silent wait
            engine.sender.group = WeightGroup(spec, 0, store)
            joining.result()
        finally:
            pool.shutdown(wait=False)  # a joiner stuck elsewhere must not hold us here
        return engine

    def _round(self, update_info: dict, send: Callable[[], None]) -> None:
        """One sync: the receivers run start, update, finish while the sender sends.

        A client with ``begin_update`` (ours: `ReceiverClient`, the env runners'
        ``EnvRunnerClient``) gets the three calls as one request per receiver, answered
        when the receiver has finished: one control round trip per sync, no thread here
        (each extra round trip costs a wake-up of the driver and of every runner, which
        on a loaded host is what a sync spends its time on).  Other clients (vLLM's
        ``VLLMWeightSyncClient``) get vLLM's round trip: start, update on a side thread
        while sending, finish."""
        begin = getattr(self.client, "begin_update", None)
        if begin is not None:
            pending = begin(update_info)
            pending.check()  # refused before any byte moved: raise that, not a timeout
            send()
            pending.result()
            return
        self.client.start_weight_update()
        pool = ThreadPoolExecutor(max_workers=1)
        try:
            receiving = pool.submit(self.client.update_weights, update_info)
            if receiving.done():
                receiving.result()  # refused before any byte moved
            send()
            receiving.result()
        finally:
            pool.shutdown(wait=False)  # a failed send leaves the receiver blocked: do not join
        self.client.finish_weight_update()

    def shutdown(self) -> None:
        self.sender.close()


class GlooTrainerEngine(_HostTrainerEngine):
    """Dense buckets broadcast over gloo (``grpo_gloo``)."""

    via = VIA_COLLECTIVE

    def _update_info(self, manifest: Manifest) -> BucketUpdate:
        return BucketUpdate(manifest_to_wire(manifest))

    def send_weights(self) -> None:
        source = self.source
        if not self.is_sender:
            source.replay()
            return
        manifest = source.manifest
        self._round(as_dict(self._update_info(manifest)),
                    lambda: self.sender.send(manifest, source.tensor, self.via))


class ShmTrainerEngine(GlooTrainerEngine):
    """Dense buckets through two shared-memory slots (``grpo_shm``)."""

    via = VIA_SHM

    def _update_info(self, manifest: Manifest) -> BucketUpdate:
        slots = self.sender.ensure_slots(max(1, manifest.max_bucket_bytes))
        return BucketUpdate(manifest_to_wire(manifest), list(slots.paths), slots.nbytes)

    def send_weights(self) -> None:
        super().send_weights()
        if self.sender.slots is not None:
            self.sender.slots.unlink()  # every receiver mapped them: nothing left behind


class SparseGlooTrainerEngine(_HostTrainerEngine):
    """vLLM's ``sparse_nccl`` trainer contract over gloo: ``send_weights(patches)`` (a
    dense patch sends its values only)."""

    def send_weights(self, patches: Iterable[SparsePatch] | None = None) -> None:
        patches = list(patches or []) if self.is_sender else []
        if not patches:
            return
        info = SparseUpdate([p.name for p in patches], [dtype_name(p.values.dtype) for p in patches],
                            [list(p.full_shape) for p in patches],
                            [p.values.numel() for p in patches])

        def send() -> None:
            group = self.sender._group()
            for patch in patches:
                if not patch.dense:
                    group.broadcast(patch.indices.to("cpu")).wait()
                group.broadcast(patch.values.to("cpu")).wait()

        self._round(as_dict(info), send)


_OURS = {cls.backend: engine for cls, engine in (
    (HostTrainerInit, GlooTrainerEngine), (ShmTrainerInit, ShmTrainerEngine),
    (SparseGlooTrainerInit, SparseGlooTrainerEngine))}


def connect(init_info: Any, client: Any, source: Any = None) -> Any:
    """A ready trainer engine: vLLM's ``WeightTransferTrainerFactory.trainer_init`` (ours
    registered with it first); without vLLM, ours directly."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rllib_grpo.weights.engines import register_engines
    except ImportError:
        if init_info.backend not in _OURS:
            raise
        return _OURS[init_info.backend].trainer_init(init_info, client=client, source=source)
    register_engines()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


def vllm_trainer_init(backend: str, *, host: str, port: int, world_size: int, rank: int,
                      packed: bool = True) -> Any:
    """vLLM's own trainer init info for ``nccl`` / ``ipc``."""
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(packed=packed, rank=rank)
    if backend == "nccl":
        from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

        return NCCLTrainerInitInfo(host, port, world_size, packed=packed, rank=rank)
    raise ValueError(f"{backend!r} is not one of vLLM's trainer engines")


def host_trainer_init(backend: str, *, host: str, world_size: int, rank: int,
                      timeout_s: float = 300.0) -> HostTrainerInit:
    """Our trainer init info for ``grpo_shm`` / ``grpo_gloo`` / ``grpo_sparse_gloo``."""
    cls = {GLOO_BACKEND: HostTrainerInit, SHM_BACKEND: ShmTrainerInit,
           SPARSE_GLOO_BACKEND: SparseGlooTrainerInit}[backend]
    return cls(host, world_size, timeout_s, rank=rank)



class PendingUpdate:
    """An update the receivers run (start, update, finish) while the sender sends: a future
    per receiver; `check` raises the error of one that already failed, `result` waits."""

    def __init__(self, futures: list[Any]) -> None:
        self.futures = futures

    def check(self) -> None:
        for future in self.futures:
            if future.done():
                future.result()

    def result(self) -> None:
        for future in self.futures:
            future.result()


class ReceiverClient:
    """vLLM's ``VLLMWeightSyncClient`` over one in-process `WeightReceiver` (a sampler): what
    `rllib_grpo.rllib.algorithm.weight_client.EnvRunnerClient` does over env runner actors,
    for benchmarks and checks that drive an engine directly.  ``last_update``: the update
    info of the latest ``update_weights``.  ``begin_update`` runs one whole update (start,
    update, finish) on a thread of its own, as an env runner runs it in its process."""

    def __init__(self, receiver: Any, backend: str) -> None:
        self.receiver, self.backend = receiver, backend
        self.last_update: dict[str, Any] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight_receiver")

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self.receiver.init_weight_transfer_engine({"backend": self.backend,
                                                   "init_info": init_info})

    def start_weight_update(self) -> None:
        self.receiver.start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.last_update = update_info
        self.receiver.update_weights(update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self.receiver.finish_weight_update()

    def begin_update(self, update_info: dict[str, Any]) -> PendingUpdate:
        def whole() -> None:
            self.start_weight_update()
            self.update_weights(update_info)
            self.finish_weight_update()

        return PendingUpdate([self._pool.submit(whole)])


def connect_receiver(receiver: Any, backend: str, source: Any = None,
                     timeout_s: float = 300.0) -> Any:
    """One of our host engines (``grpo_shm`` / ``grpo_gloo`` / ``grpo_sparse_gloo``) from
    this process to the in-process ``receiver``: its trainer engine, client at ``.client``."""
    init = host_trainer_init(backend, host="127.0.0.1",
                             world_size=1 + receiver.num_weight_ranks, rank=0,
                             timeout_s=timeout_s)
    return connect(init, ReceiverClient(receiver, backend), source)
