"""Our host-memory weight-transfer engines, registered with vLLM's own factory
(``vllm.distributed.weight_transfer.WeightTransferEngineFactory``), so that a vLLM worker
receives weights only through vLLM's API: ``init_weight_transfer_engine``, then per sync
``start_weight_update`` / ``update_weights`` / ``finish_weight_update``.

* ``grpo_shm``, ``grpo_gloo``: dense buckets (`rllib_grpo.weights.layout`) through shared
  memory or a gloo broadcast, loaded with vLLM's layer-wise reload (as vLLM's ``nccl``
  engine loads: ``initialize_layerwise_reload`` at start, ``model.load_weights`` per
  bucket, ``finalize_layerwise_reload`` at finish).
* ``grpo_sparse_gloo``: vLLM's ``sparse_nccl`` wire format over gloo, plus dense tensors
  where they are fewer bytes (`rllib_grpo.weights.wire`): patches a host copy of the
  checkpoint and reloads the touched layers (`SparseGlooEngine`); every delta sync.
* ``grpo``: what every `VLLMSampler` engine is created with; its init info names one of
  the above or vLLM's ``nccl`` / ``ipc`` / ``sparse_nccl``, which it creates through the
  factory and hands every call to.
* ``grpo_nccl`` (trainer side only): vLLM's NCCL trainer engine on a rendezvous port bound
  before the receivers are told of it, its store waiting no longer than the package's
  deadline (`NcclTrainerEngine`); the receivers run vLLM's own ``nccl`` engine.

`register_engines` runs in each process that creates engines: the sampler's, and every
vLLM worker process (``rllib_grpo.samplers.vllm_worker`` is the engine's
``worker_extension_cls``, imported by each worker before it loads the model).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import (
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.distributed.weight_transfer.nccl_common import (
    NCCLWeightTransferInitInfo,
    worker_init_payload,
)
from vllm.distributed.weight_transfer.nccl_engine import (
    NCCLTrainerInitInfo,
    NCCLTrainerWeightTransferEngine,
)

from rllib_grpo.weights.names import fused_closure, module_of
from rllib_grpo.weights.transport import JOIN_GRACE_S, on_daemon_thread
from rllib_grpo.weights.wire import (
    DISPATCH_BACKEND,
    GLOO_BACKEND,
    NCCL_TRAINER_BACKEND,
    SHM_BACKEND,
    SPARSE_GLOO_BACKEND,
    BucketUpdate,
    DispatchInit,
    GroupInit,
    HostReceiver,
    SparseUpdate,
)

EMBED_KEY, LM_HEAD_KEY = "model.embed_tokens.weight", "lm_head.weight"
_TRAINERS = {SHM_BACKEND: "ShmTrainerEngine", GLOO_BACKEND: "GlooTrainerEngine",
             SPARSE_GLOO_BACKEND: "SparseGlooTrainerEngine"}


def register_engines() -> None:
    """Register our worker engines and trainer engines with vLLM's factories (idempotent)."""
    workers = {DISPATCH_BACKEND: "DispatchEngine", SHM_BACKEND: "ShmBucketEngine",
               GLOO_BACKEND: "GlooBucketEngine", SPARSE_GLOO_BACKEND: "SparseGlooEngine"}
    for name, cls in workers.items():
        if name not in WeightTransferEngineFactory._registry:
            WeightTransferEngineFactory.register_engine(name, __name__, cls)
    for name, cls in _TRAINERS.items():
        if name not in WeightTransferTrainerFactory._registry:
            WeightTransferTrainerFactory.register_engine(name, "rllib_grpo.weights.trainer", cls)
    if NCCL_TRAINER_BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(NCCL_TRAINER_BACKEND, NcclTrainerEngine)


def _worker_rank(engine: WeightTransferEngine) -> int:
    """This worker's rank among the engine's workers (data-parallel replicas included)."""
    parallel = engine.parallel_config
    return int(parallel.data_parallel_index * parallel.world_size + parallel.rank)


class _GroupInit(GroupInit, WeightTransferInitInfo):
    pass


class _BucketUpdate(BucketUpdate, WeightTransferUpdateInfo):
    pass


class _SparseUpdate(SparseUpdate, WeightTransferUpdateInfo):
    pass


class _HostEngine(WeightTransferEngine):
    """A gloo group member on a vLLM worker (the base of our engines)."""

    init_info_cls = _GroupInit
    supports_draft_weight_update = False

    def __init__(self, config: WeightTransferConfig, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.receiver = HostReceiver()

    def init_transfer_engine(self, init_info: Any) -> None:
        self.receiver.init(init_info, _worker_rank(self))

    def update_weights(self, update_info: dict[str, Any]) -> None:
        """vLLM's, without its ``torch.accelerator.synchronize()`` (no device on CPU)."""
        self.receive_weights(self.parse_update_info(update_info))
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def shutdown(self) -> None:
        self.receiver.close()


class GlooBucketEngine(_HostEngine):
    """Dense buckets broadcast over gloo, loaded with vLLM's layer-wise reload."""

    update_info_cls: type[WeightTransferUpdateInfo] = _BucketUpdate

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)

    def receive_weights(self, update_info: Any) -> None:
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        with disable_mtp_completeness_check():
            self.model.load_weights(self.receiver.stream(update_info))


class ShmBucketEngine(GlooBucketEngine):
    """Dense buckets through shared-memory slots (the gloo group only signals); the
    update info names the slots, so the receiving code is `GlooBucketEngine`'s."""


class SparseGlooEngine(GlooBucketEngine):
    """Delta syncs, on every device: vLLM's ``sparse_nccl`` wire format over gloo (int32
    flat indices and values per tensor), a tensor travelling whole where that is fewer
    bytes.  The worker keeps the checkpoint tensors in host memory, patches them, and
    reloads the touched layers (fused siblings and a tied head with them) through vLLM's
    layer-wise reload.  The first sync after a join carries every tensor whole
    (`rllib_grpo.weights.delta.DeltaTracker`).

    Why not vLLM's own ``sparse_nccl`` engine (in-place patches through
    ``load_checkpoint_weight_patches``): (1) its format has no dense form, so a tensor
    with more than itemsize / (4 + itemsize) of its elements changed (fp32: a half, bf16: a
    third; one AdamW step changes most fp32 elements) costs more than a full sync; (2) the
    in-place loader writes through each runtime parameter's ``weight_loader``: vLLM's CPU
    linear layers replace their weight by an empty Parameter without one after packing it
    for oneDNN (``dispatch_cpu_unquantized_gemm(remove_weight=True)``), so it fails there
    ("'Parameter' object has no attribute 'weight_loader'"), as does any quantized layer
    that re-creates its parameters; CUDA's unquantized layers keep theirs, but it has not
    run on a GPU here.  Reloading touched layers works wherever a full sync does."""

    update_info_cls = _SparseUpdate

    def __init__(self, config: WeightTransferConfig, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.checkpoint: dict[str, torch.Tensor] = {}

    def receive_weights(self, update_info: Any) -> None:
        from vllm.model_executor.model_loader.mtp_validation import (
            disable_mtp_completeness_check,
        )

        touched = set()
        for patch in self.receiver.patches(update_info):
            held = self.checkpoint.get(patch.name)
            if patch.indices is None:  # the whole tensor
                self.checkpoint[patch.name] = patch.values.view(patch.shape)
            elif held is None:
                raise RuntimeError(f"delta sync: {patch.name} arrived in part before it "
                                   "arrived whole (the first delta after a join is whole)")
            else:
                held.view(-1)[patch.indices.long()] = patch.values
            touched.add(module_of(patch.name))
        modules = fused_closure(touched)
        weights = [(n, t) for n, t in self.checkpoint.items() if module_of(n) in modules]
        tied = getattr(self.model_config.hf_text_config, "tie_word_embeddings", False)
        if tied and EMBED_KEY in dict(weights):
            weights.append((LM_HEAD_KEY, self.checkpoint[EMBED_KEY]))
        with disable_mtp_completeness_check():
            self.model.load_weights(weights)


class _DispatchInit(DispatchInit, WeightTransferInitInfo):
    pass


class DispatchEngine(WeightTransferEngine):
    """The engine a sampler starts with: creates the backend its init info names (ours or
    vLLM's) through vLLM's factory and hands every call to it."""

    init_info_cls = _DispatchInit
    update_info_cls = WeightTransferUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, config: WeightTransferConfig, vllm_config: Any, device: torch.device,
                 model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self.delegate: WeightTransferEngine | None = None
        self.backend: str | None = None

    def _engine(self) -> WeightTransferEngine:
        if self.delegate is None:
            raise RuntimeError("weight transfer: init_weight_transfer_engine was not called")
        return self.delegate

    def init_transfer_engine(self, init_info: Any) -> None:
        register_engines()
        self.shutdown()
        delegate = WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend=init_info.backend), self.vllm_config, self.device,
            self._default_model)
        delegate.init_transfer_engine(delegate.parse_init_info(init_info.init_info))
        self.delegate, self.backend = delegate, init_info.backend

    def set_weight_update_target(self, model: torch.nn.Module, model_config: Any) -> None:
        super().set_weight_update_target(model, model_config)
        self._engine().set_weight_update_target(model, model_config)

    def reset_weight_update_target(self) -> None:
        super().reset_weight_update_target()
        if self.delegate is not None:
            self.delegate.reset_weight_update_target()

    def start_weight_update(self) -> None:
        self._engine().start_weight_update()

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self._engine().update_weights(update_info)

    def receive_weights(self, update_info: Any) -> None:
        raise NotImplementedError("DispatchEngine hands update_weights to its backend")

    def finish_weight_update(self) -> None:
        self._engine().finish_weight_update()

    def shutdown(self) -> None:
        delegate, self.delegate, self.backend = self.delegate, None, None
        if delegate is not None:
            delegate.shutdown()


# --------------------------------------------------------------------------- NCCL, trainer side
@dataclass
class NcclTrainerInit(NCCLTrainerInitInfo):
    """vLLM's NCCL trainer init info plus, on rank 0, the socket already listening on
    ``master_port`` (``listener``: bound before the receivers are told the port, so no
    other process can take it in between) and the longest the rendezvous waits."""

    backend: ClassVar[str] = NCCL_TRAINER_BACKEND
    timeout_s: float = 300.0
    listener: socket.socket | None = field(default=None, repr=False, compare=False)


class NcclTrainerEngine(NCCLTrainerWeightTransferEngine):
    """vLLM's NCCL trainer engine (``send_weights`` and the receivers' side are vLLM's),
    its rendezvous opened on the socket the init info holds: vLLM's
    ``StatelessProcessGroup`` takes it over (``listen_socket``), where vLLM's own
    ``trainer_init`` would bind ``master_port`` anew."""

    @classmethod
    def trainer_init(cls, init_info: NcclTrainerInit, *, client: Any, source: Any = None
                     ) -> NcclTrainerEngine:
        if source is None:
            raise ValueError("NCCL trainer weight transfer requires a WeightSource.")
        engine = cls(client=client, source=source, is_sender=init_info.is_sender,
                     packed=init_info.packed,
                     packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
                     packed_num_buffers=init_info.packed_num_buffers)
        if not engine.is_sender:
            return engine
        if init_info.listener is None:
            raise ValueError("nccl: rank 0's init info has no listening socket "
                             "(rllib_grpo.weights.trainer.vllm_trainer_init binds it)")
        workers = NCCLWeightTransferInitInfo(  # at rank_offset 1, after the sender
            master_address=init_info.master_address, master_port=init_info.master_port,
            rank_offset=1, world_size=init_info.world_size, packed=init_info.packed,
            packed_buffer_size_bytes=init_info.packed_buffer_size_bytes,
            packed_num_buffers=init_info.packed_num_buffers)
        listener, init_info.listener = init_info.listener, None  # the store owns it now
        # The receivers block in their rendezvous: they join from a side thread.
        joining = on_daemon_thread(client.init_weight_transfer_engine,
                                   worker_init_payload(workers))
        engine.model_update_group = _open_sender(init_info, listener)
        joining.result()
        return engine


def _open_sender(init_info: NcclTrainerInit, listener: socket.socket) -> Any:
    """Rank 0's NCCL communicator, vLLM's ``stateless_init_process_group`` on the socket
    ``listener`` already holds.  The store waits a little longer than the package's deadline
    (`rllib_grpo.weights.trainer.connect`), whose error names what to open, and then lets
    this thread go."""
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
    from vllm.distributed.utils import StatelessProcessGroup
    from vllm.utils.nccl import unpinned_nccl_env

    group = StatelessProcessGroup.create(
        host=init_info.master_address, port=init_info.master_port, rank=0,
        world_size=init_info.world_size, listen_socket=listener,
        store_timeout=int(init_info.timeout_s + 2 * JOIN_GRACE_S) + 1)
    with unpinned_nccl_env():
        return PyNcclCommunicator(group, device=torch.accelerator.current_device_index())
