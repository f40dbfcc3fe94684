"""The weight-receiving half of `rllib_grpo.samplers.vllm.VLLMSampler`: vLLM's own API.

A whole state dict (the object store, ``local``, ``shm``'s views of the node's shared file)
goes through ``reload_weights`` (`VLLMSampler.load_weights`).  On GPUs the engine is
started with vLLM's ``ipc`` or ``nccl`` weight-transfer engine (``weight_transfer_backend``,
what the weight sync's planner picks for where it runs) and the driver's weight sync calls
vLLM's four methods on it, which fan out to the engine's workers with ``collective_rpc``:
``init_weight_transfer_engine``, then per sync ``start_weight_update``,
``update_weights``, ``finish_weight_update``.  This module imports no vLLM.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rllib_grpo.models.lora import fused_closure, module_of

EMBED_KEY, LM_HEAD_KEY = "model.embed_tokens.weight", "lm_head.weight"
# The first vLLM release with every vLLM API this package calls; pyproject's ``[vllm]``
# extra pins the same (a test keeps them equal).  The last to arrive decide it:
# ``Worker.shutdown_weight_transfer_engine`` (0.32.0: an engine leaving its NCCL group
# before it joins the next), NCCL groups formed from a unique id and vLLM's packed
# producers (0.32.0), ``reload_weights(weights_iterator=...)`` (0.16.0).
MIN_VLLM = "0.32"


def require_supported_vllm() -> None:
    """Refuse, at start-up, a vLLM without the APIs weight syncs go through (else a sync
    would fail mid-run), naming the release that has them."""
    import vllm

    missing = _missing_vllm_apis()
    if missing:
        raise RuntimeError(
            f"vLLM {getattr(vllm, '__version__', '?')} lacks {'; '.join(missing)}, which "
            f"weight syncs go through: install vllm>={MIN_VLLM} (pip install "
            f"'rllib-grpo[vllm]').")


def _missing_vllm_apis() -> list[str]:
    """The APIs (of those `MIN_VLLM` names) the installed vLLM lacks."""
    try:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.weight_transfer import packed_tensor
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
        from vllm.v1.worker.gpu_worker import Worker
    except ImportError as error:
        return [f"the weight-transfer modules ({error})"]
    missing = []
    reload = getattr(GPUModelRunner, "reload_weights", None)
    if reload is None or "weights_iterator" not in inspect.signature(reload).parameters:
        missing.append("reload_weights(weights_iterator=...)")
    missing += [f"Worker.{method}" for method in (
        "init_weight_transfer_engine", "shutdown_weight_transfer_engine")
        if not hasattr(Worker, method)]
    if not hasattr(PyNcclCommunicator, "from_unique_id_bytes"):
        missing.append("NCCL groups from a unique id")
    missing += [f"packed_tensor.{producer}" for producer in (
        "packed_ipc_producer", "packed_nccl_broadcast_producer")
        if not hasattr(packed_tensor, producer)]
    return missing


def worker_gpu_uuid(worker: Any) -> str:
    """Run on a vLLM worker (``collective_rpc``): the UUID of the GPU it drives."""
    return str(torch.cuda.get_device_properties(worker.device).uuid)


class VLLMWeightTransfer:
    """Mixed into `VLLMSampler` (which sets ``llm``, ``on_cpu``, ``tied_embeddings``,
    ``weight_transfer_backend`` and ``_checkpoint_keys``): the receiving side of every
    weight sync."""

    llm: Any
    on_cpu: bool
    tied_embeddings: bool
    weight_transfer_backend: str | None
    _checkpoint_keys: set[str]

    @property
    def device(self) -> torch.device:
        """Where the engine's weights live: ``cpu`` or ``cuda`` (its workers hold the GPUs)."""
        return torch.device("cpu" if self.on_cpu else "cuda")

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype weights should travel in: the engine's."""
        return self.llm.llm_engine.model_config.dtype

    @property
    def takes_gpu_engines(self) -> bool:
        """vLLM's GPU weight-transfer engines (``ipc``, ``nccl``) load into this engine."""
        return not self.on_cpu

    @property
    def rank_gpus(self) -> tuple[str, ...]:
        """The UUID of the GPU each worker runs on, in rank order: what the workers report,
        so that an engine that narrowed ``CUDA_VISIBLE_DEVICES`` (a colocated
        tensor-parallel one) is placed right where its env runner's CUDA saw Ray's one GPU.
        Empty on CPU."""
        if self.on_cpu:
            return ()
        return tuple(str(uuid) for uuid in self.llm.collective_rpc(worker_gpu_uuid))

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """vLLM's, on every worker, after leaving the group of an earlier init (an NCCL
        group formed again once an env runner restarted)."""
        self.llm.collective_rpc("shutdown_weight_transfer_engine")
        self.llm.collective_rpc("init_weight_transfer_engine", kwargs={"init_info": init_info})

    def start_weight_update(self) -> None:
        self.llm.collective_rpc("start_weight_update")

    def update_weights(self, update_info: dict) -> None:
        self.llm.collective_rpc("update_weights", kwargs={"update_info": update_info})

    def finish_weight_update(self) -> None:
        """Finish the update on every worker, then drop the prefixes the old weights cached."""
        self.llm.collective_rpc("finish_weight_update")
        self.llm.reset_prefix_cache()

    def check_weight_names(self, names: Iterable[str]) -> None:
        """Refuse a partial or foreign set of names before a sync moves a byte."""
        self._check_keys(set(names))

    def _with_lm_head(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """vLLM keeps a tied head it is not given: the embeddings under its name too."""
        weights = dict(state_dict)
        if LM_HEAD_KEY not in weights and EMBED_KEY in weights and self.tied_embeddings:
            weights[LM_HEAD_KEY] = weights[EMBED_KEY]
        return weights

    def _check_keys(self, weights: Mapping[str, torch.Tensor] | set[str],
                    partial: bool = False) -> None:
        """vLLM keeps any weight it is not given; refuse a partial (unless ``partial``: then
        an incomplete fused layer) or foreign state dict."""
        if not self._checkpoint_keys:  # a hub id: nothing on disk to compare with
            return
        required = self._checkpoint_keys
        if partial:
            touched = fused_closure({module_of(k) for k in weights})
            required = {k for k in required if module_of(k) in touched}
        missing = required - set(weights)
        unexpected = set(weights) - self._checkpoint_keys - {LM_HEAD_KEY}
        if missing or unexpected:
            raise KeyError(
                f"state dict does not match the checkpoint: missing {sorted(missing)}, "
                f"unexpected {sorted(unexpected)}"
            )
