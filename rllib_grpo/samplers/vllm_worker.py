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

from typing import Any

from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import BucketReceiver, GroupSpec, SlotsSpec

EXTENSION_QUALNAME = "rllib_grpo.samplers.vllm_worker.WeightSyncExtension"


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
            return {name: tensor.detach().to("cpu", copy=True) for name, tensor in stream}
        self.reload_weights(weights_iterator=stream)  # type: ignore[attr-defined]  # vLLM's worker
        return None

    def grpo_leave_weight_group(self) -> None:
        self.grpo_weight_receiver().close()
