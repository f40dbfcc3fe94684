"""The learner side of a weight sync (`rllib_grpo.rllib.algorithm.weight_sync` drives it).

Each learner owns one `WeightSender` (`GRPOLearner.weight_sender`, made on first use); the
driver reaches it through the ``learner_*`` functions below, run on every learner by
``LearnerGroup.foreach_learner``.  The sender holds one trainer engine per weight-transfer
backend in use, made by vLLM's ``WeightTransferTrainerFactory.trainer_init``
(`rllib_grpo.weights.trainer.connect`): vLLM's ``nccl`` / ``ipc`` on GPUs,
our ``grpo_shm`` / ``grpo_gloo`` / ``grpo_sparse_gloo`` in host memory.  Each drives the env
runners through the client the driver hands over (init, start, update, finish).  Learner
rank 0 sends; with FSDP every learner gathers each tensor from its shards in the manifest's
order (a collective), as vLLM's engines iterate a ``WeightSource`` on every rank.

What is sent: the policy's HF state dict as it lives on the learner's device (no host
copy; the wire cast happens while packing), laid out by `rllib_grpo.weights.layout`; for a
delta sync, the elements that changed since the last one (`DeltaTracker`, rank 0).  LoRA
payloads go through Ray's object store (`rllib_grpo.weights.plan`).
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
from rllib_grpo.weights.delta import DeltaTracker, patch_nbytes
from rllib_grpo.weights.layout import (
    Manifest,
    pipelined_bucket_bytes,
    plan_manifest,
    split_aliases,
    wire_nbytes,
)
from rllib_grpo.weights.plan import Endpoint
from rllib_grpo.weights.trainer import (
    ManifestSource,
    connect,
    host_trainer_init,
    vllm_trainer_init,
)
from rllib_grpo.weights.wire import HOST_BACKENDS, SPARSE_BACKENDS

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
    """A learner's half of weight syncs: what to send and the trainer engines sending it."""

    def __init__(self, learner: Any) -> None:
        self.learner = learner
        self.manifest: Manifest | None = None
        self._planned_for: tuple | None = None
        self._tensors: dict[str, torch.Tensor] = {}
        self.source = ManifestSource(Manifest(()), self.tensor)
        self.engines: dict[str, Any] = {}  # backend -> trainer engine
        self.deltas: dict[str, DeltaTracker] = {}  # sparse backend -> what its receivers hold

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

    def stage(self, wire_dtype: torch.dtype | None, bucket_bytes: int) -> dict:
        """Lay out this sync (the manifest every engine sends by).  On every learner."""
        tensors, aliases = split_aliases(self.module.lm.state_dict())
        self._tensors = tensors
        # The layout changes only with the tensors' names, shapes and dtypes: plan it once.
        key = (tuple((n, tuple(t.shape), t.dtype, t.is_contiguous()) for n, t in tensors.items()),
               aliases, wire_dtype, bucket_bytes)
        if key != self._planned_for:
            total = wire_nbytes(tensors, wire_dtype)
            self.manifest = plan_manifest(
                tensors, wire_dtype=wire_dtype, aliases=aliases,
                bucket_bytes=pipelined_bucket_bytes(total, bucket_bytes),
                direct_min_bytes=DIRECT_MIN_BYTES)
            self._planned_for = key
        self.source.manifest = self._manifest()
        return {"manifest": self._manifest(), "rank": rank(), "seq_no": self.weights_seq_no()}

    def _manifest(self) -> Manifest:
        if self.manifest is None:
            raise RuntimeError("WeightSender: nothing staged yet (stage() plans the manifest)")
        return self.manifest

    def tensor(self, name: str) -> torch.Tensor:
        return _gathered(self._tensors[name])

    # ------------------------------------------------------------------ the engines
    def connect(self, backend: str, world_size: int, client: Any, timeout_s: float) -> None:
        """vLLM's ``trainer_init`` for ``backend`` on every learner; rank 0 drives the
        runners' ``init_weight_transfer_engine`` through ``client``, and opens the
        rendezvous on a port it holds before telling them; a group not formed within
        ``timeout_s`` raises one line naming the runners, the address and what to open."""
        self.disconnect(backend)
        host = ray.util.get_node_ip_address()
        make_init = host_trainer_init if backend in HOST_BACKENDS else vllm_trainer_init
        init_info = make_init(backend, host=host, world_size=world_size, rank=rank(),
                              timeout_s=timeout_s)
        sparse = backend in SPARSE_BACKENDS
        with self._on_device():
            self.engines[backend] = connect(init_info, client, None if sparse else self.source,
                                            timeout_s)
        if sparse:
            self.deltas[backend] = DeltaTracker()  # new receivers: the first sync is whole

    def send(self, backend: str) -> dict[str, float]:
        """One sync through ``backend``'s engine; returns ``{"bytes", "changed",
        "elements"}`` (bytes one receiver took; changed elements for a delta)."""
        engine = self.engines[backend]
        engine.client.version = self.weights_seq_no()
        manifest = self._manifest()
        stats = {"bytes": float(manifest.nbytes), "changed": 0.0, "elements": 0.0}
        with self._on_device():
            if backend not in SPARSE_BACKENDS:
                engine.send_weights()
            elif rank() != 0:
                self.source.replay()  # gather in the same order as rank 0
            else:
                patches, changed, total = self.deltas[backend].patches(self.source)
                if patches:
                    engine.send_weights(patches)
                else:  # nothing changed: the runners still take the new version
                    engine.client.start_weight_update()
                    engine.client.finish_weight_update()
                stats = {"bytes": float(sum(patch_nbytes(p) for p in patches)),
                         "changed": float(changed), "elements": float(total)}
        return stats

    def done(self) -> None:
        """The sync is over: drop the references to this step's tensors."""
        self._tensors = {}

    def disconnect(self, backend: str) -> None:
        engine = self.engines.pop(backend, None)
        self.deltas.pop(backend, None)
        if engine is not None:
            engine.shutdown()

    def close(self) -> None:
        for backend in list(self.engines):
            self.disconnect(backend)


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


def learner_connect(learner: SendingLearner, backend: str, world_size: int, client: Any,
                    timeout_s: float) -> None:
    learner.weight_sender.connect(backend, world_size, client, timeout_s)


def learner_disconnect(learner: SendingLearner, backend: str) -> None:
    """Shut ``backend``'s trainer engine down (its runners joined another one)."""
    learner.weight_sender.disconnect(backend)


def learner_stage(learner: SendingLearner, wire_dtype: torch.dtype | None, bucket_bytes: int
                  ) -> tuple[int, dict]:
    """``(rank, what `WeightSender.stage` staged)``."""
    return rank(), learner.weight_sender.stage(wire_dtype=wire_dtype, bucket_bytes=bucket_bytes)


def learner_send(learner: SendingLearner, backend: str) -> tuple[int, dict[str, float]]:
    """``(rank, the send's stats)``."""
    return rank(), learner.weight_sender.send(backend)


def learner_local_state(learner: SendingLearner) -> tuple[Any, int]:
    """``(the live tensors or LoRA payload, the weights' sequence number)``, for a runner
    in this process."""
    sender = learner.weight_sender
    return sender.local_state(), sender.weights_seq_no()


def learner_done(learner: SendingLearner) -> None:
    """The sync is over: drop this step's tensors."""
    learner.weight_sender.done()


def learner_close(learner: SendingLearner) -> None:
    learner.weight_sender.close()
