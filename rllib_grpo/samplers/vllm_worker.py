"""The vLLM side of weight transfer: a worker extension, vLLM's documented route for RLHF
weight updates (``worker_extension_cls`` plus ``LLM.collective_rpc``, as in vLLM's
``examples/offline_inference/rlhf_utils.py``).

Every vLLM worker joins the learner's weight group itself (one rank per worker, so a
tensor-parallel engine works the same way) and streams the buckets straight into
``reload_weights``: no state dict is assembled, no file written.  `VLLMSampler` names this
class in its engine arguments; its ``join_weight_group`` / ``prepare_weights`` /
``receive_weights`` call the methods below through ``collective_rpc``.
"""

from __future__ import annotations

import inspect
from typing import Any

from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import BucketReceiver, GroupSpec, SlotsSpec, ipc_copies_done

EXTENSION_QUALNAME = "rllib_grpo.samplers.vllm_worker.WeightSyncExtension"
# The first vLLM with ``reload_weights(weights_iterator=...)`` (the layerwise reload, vLLM
# PR #32133); pyproject's ``[vllm]`` extra pins the same (a test keeps them equal).
MIN_VLLM = "0.16"


def require_layerwise_reload() -> None:
    """Refuse, at start-up, a vLLM whose workers cannot ``reload_weights`` from an iterator
    (every sync would fail with a TypeError)."""
    import vllm
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    reload = getattr(GPUModelRunner, "reload_weights", None)
    if reload is None or "weights_iterator" not in inspect.signature(reload).parameters:
        raise RuntimeError(
            f"vLLM {getattr(vllm, '__version__', '?')} has no reload_weights(weights_iterator="
            f"...), which weight syncs stream into: install vllm>={MIN_VLLM} "
            "(pip install 'rllib-grpo[vllm]').")


class WeightSyncExtension:
    """Mixed into vLLM's worker class (methods only: vLLM refuses clashing names)."""

    def grpo_weight_receiver(self) -> BucketReceiver:
        receiver = self.__dict__.get("_grpo_weight_receiver")
        if receiver is None:
            receiver = self.__dict__["_grpo_weight_receiver"] = BucketReceiver()
        return receiver

    def grpo_join_weight_group(self, spec: GroupSpec, rank_offset: int) -> None:
        """Join as rank ``rank_offset`` + this worker's rank in the engine."""
        self.grpo_weight_receiver().join(spec, rank_offset + int(getattr(self, "rank", 0)))

    def grpo_map_slots(self, slots: SlotsSpec) -> None:
        self.grpo_weight_receiver().map_slots(slots)

    def grpo_receive_weights(self, manifest: Manifest, via: str, ipc: dict | None = None,
                             materialize: bool = False) -> Any:
        """Stream a sync into ``reload_weights`` (the weights are loaded layer by layer as
        the buckets arrive), or return copies of the tensors (``materialize``)."""
        stream = self.grpo_weight_receiver().stream(manifest, via, ipc)
        if materialize:
            tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in stream}
            ipc_copies_done(via)
            return tensors
        self.reload_weights(weights_iterator=stream)  # type: ignore[attr-defined]  # vLLM's worker
        # After reload_weights, not after the stream: the layerwise reload copies some
        # tensors (a layer's last, the tied embeddings) only once the stream has ended.
        ipc_copies_done(via)
        return None

    def grpo_leave_weight_group(self) -> None:
        self.grpo_weight_receiver().close()
