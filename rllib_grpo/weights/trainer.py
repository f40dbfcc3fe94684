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

import contextlib
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import Any, ClassVar, NamedTuple

import torch
import torch.distributed as dist

from rllib_grpo.weights.delta import SparsePatch
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import (
    JOIN_GRACE_S,
    VIA_COLLECTIVE,
    VIA_SHM,
    BucketSender,
    GroupSpec,
    WeightGroup,
    did_not_join,
    listening_socket,
    on_daemon_thread,
    open_store,
    wait_for_members,
)
from rllib_grpo.weights.wire import (
    GLOO_BACKEND,
    NCCL_TRAINER_BACKEND,
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
    selects the engine, ``rank`` 0 sends): the gloo group's host and size; on rank 0 the
    rendezvous store, listening already (`open_store`), and the spec naming its port."""

    backend: ClassVar[str] = GLOO_BACKEND
    host: str
    world_size: int
    timeout_s: float = 300.0
    rank: int = field(default=0, kw_only=True)
    store: dist.TCPStore | None = field(default=None, kw_only=True, repr=False)
    spec: GroupSpec | None = field(default=None, kw_only=True)

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
        store, spec = init_info.store, init_info.spec
        if store is None or spec is None:
            raise ValueError(f"{init_info.backend}: rank 0's init info has no rendezvous "
                             "store (host_trainer_init opens it)")
        joining = on_daemon_thread(client.init_weight_transfer_engine,
                                   as_dict(GroupInit.of(spec, rank_offset=1)))
        # A clear error, never a silent wait.
        wait_for_members(store, spec, joining, partial(receivers, client))
        engine.sender.group = WeightGroup(spec, 0, store)
        joining.result()
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


def connect(init_info: Any, client: Any, source: Any = None, timeout_s: float = 300.0) -> Any:
    """A ready trainer engine: vLLM's ``WeightTransferTrainerFactory.trainer_init`` (ours
    registered with it first); without vLLM, ours directly.

    The rendezvous has ``timeout_s``: after that (and `JOIN_GRACE_S`) `did_not_join`
    names the receivers, the address they were to join and what to open, whatever the
    engine was waiting in (a store, NCCL's own ``ncclCommInitRank``, or the receivers'
    init calls).  It runs on a thread of its own for that: one stuck past the deadline is
    left behind (a daemon; the run stops on the error)."""
    outcome: dict[str, Any] = {}
    done = threading.Event()
    # The calling thread's CUDA device, which a new thread does not inherit.
    device = torch.cuda.current_device() if torch.cuda.is_initialized() else None

    def run() -> None:
        try:
            with torch.cuda.device(device) if device is not None else contextlib.nullcontext():
                outcome["engine"] = _trainer_init(init_info, client, source)
        except BaseException as error:  # noqa: BLE001 - handed to the caller
            outcome["error"] = error
        finally:
            done.set()

    threading.Thread(target=run, name="weight_group_connect", daemon=True).start()
    if not done.wait(timeout_s + JOIN_GRACE_S):
        group = "NCCL" if init_info.backend == NCCL_TRAINER_BACKEND else (
            "gloo" if init_info.backend in _OURS else init_info.backend)
        raise did_not_join(receivers(client), group, timeout_s, rendezvous_address(init_info))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["engine"]


def _trainer_init(init_info: Any, client: Any, source: Any) -> Any:
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory

        from rllib_grpo.weights.engines import register_engines
    except ImportError:
        if init_info.backend not in _OURS:
            raise
        return _OURS[init_info.backend].trainer_init(init_info, client=client, source=source)
    register_engines()
    return WeightTransferTrainerFactory.trainer_init(init_info, client=client, source=source)


def receivers(client: Any, ranks: list[int] | None = None) -> str:
    """Who holds the group ranks ``ranks`` (None: every receiver of ``client``), in the
    client's words where it has them (`EnvRunnerClient.describe_ranks`: env runners and
    their nodes)."""
    describe = getattr(client, "describe_ranks", None)
    if describe is not None:
        return str(describe(ranks))
    return "the receivers" if ranks is None else f"receiver ranks {ranks}"


def rendezvous_address(init_info: Any) -> tuple[str, int] | None:
    """``(host, port)`` where the receivers join the sender (None: no network rendezvous,
    e.g. CUDA IPC)."""
    spec = getattr(init_info, "spec", None)
    if spec is not None:
        return spec.host, spec.port
    if getattr(init_info, "master_port", None) is not None:
        return init_info.master_address, init_info.master_port
    return None


def vllm_trainer_init(backend: str, *, host: str, world_size: int, rank: int,
                      timeout_s: float = 300.0, packed: bool = True) -> Any:
    """vLLM's own trainer init info for ``ipc``, and for ``nccl`` ours over vLLM's
    (`rllib_grpo.weights.engines.NcclTrainerInit`): on rank 0 the rendezvous port is bound
    here, before anyone is told of it, and the store waits at most ``timeout_s``."""
    if backend == "ipc":
        from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo

        return IPCTrainerInitInfo(packed=packed, rank=rank)
    if backend == "nccl":
        from rllib_grpo.weights.engines import NcclTrainerInit

        listener = listening_socket(host) if rank == 0 else None
        port = listener.getsockname()[1] if listener is not None else 0
        return NcclTrainerInit(host, port, world_size, packed=packed, rank=rank,
                               timeout_s=timeout_s, listener=listener)
    raise ValueError(f"{backend!r} is not one of vLLM's trainer engines")


def host_trainer_init(backend: str, *, host: str, world_size: int, rank: int,
                      timeout_s: float = 300.0) -> HostTrainerInit:
    """Our trainer init info for ``grpo_shm`` / ``grpo_gloo`` / ``grpo_sparse_gloo``; on
    rank 0 with the rendezvous store listening already (its port is what receivers join)."""
    cls = {GLOO_BACKEND: HostTrainerInit, SHM_BACKEND: ShmTrainerInit,
           SPARSE_GLOO_BACKEND: SparseGlooTrainerInit}[backend]
    if rank != 0:
        return cls(host, world_size, timeout_s, rank=rank)
    store, spec = open_store(host, world_size, "gloo", timeout_s)
    return cls(host, world_size, timeout_s, rank=rank, store=store, spec=spec)


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
    return connect(init, ReceiverClient(receiver, backend), source, timeout_s)
