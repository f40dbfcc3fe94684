"""The vLLM side of weight transfer: vLLM's own weight-transfer API.

Every `VLLMSampler` engine starts with ``weight_transfer_config={"backend": "grpo"}``
(`rllib_grpo.weights.engines.DispatchEngine`), which creates the backend the driver picks
(ours in host memory, vLLM's ``nccl`` / ``ipc`` / ``sparse_nccl`` on GPUs) at
``init_weight_transfer_engine``.  Our engines must be registered with vLLM's factory in
each worker process before the worker loads the model: vLLM imports this module there
(`rllib_grpo.samplers.vllm_extension` is the engine's ``worker_extension_cls``), and
importing that module registers them.  This module imports no vLLM.
"""

from __future__ import annotations

import inspect
from typing import Any

EXTENSION_QUALNAME = "rllib_grpo.samplers.vllm_extension.WeightSyncExtension"
# The first vLLM release with every vLLM API this package calls; pyproject's ``[vllm]``
# extra pins the same (a test keeps them equal).  The last to arrive decide it:
# ``Worker.shutdown_weight_transfer_engine`` (0.32.0; a runner leaving its weight group),
# the NCCL trainer engine ``NCCLTrainerInitInfo`` (0.28.0), ``IPCTrainerInitInfo(rank=)``
# (0.27.0), ``WeightTransferTrainerFactory`` (0.26.0).
MIN_VLLM = "0.32"


def require_supported_vllm() -> None:
    """Refuse, at start-up, a vLLM without the weight-transfer API that weight syncs go
    through (else a sync would fail mid-run), naming the release that has it."""
    import vllm

    missing = _missing_vllm_apis()
    if missing:
        raise RuntimeError(
            f"vLLM {getattr(vllm, '__version__', '?')} lacks {'; '.join(missing)}, which "
            f"weight syncs go through: install vllm>={MIN_VLLM} (pip install "
            f"'rllib-grpo[vllm]').")


def _missing_vllm_apis() -> list[str]:
    """The weight-transfer APIs (of those `MIN_VLLM` names) the installed vLLM lacks."""
    try:
        from vllm.distributed.weight_transfer.factory import WeightTransferTrainerFactory
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
    if "nccl" not in WeightTransferTrainerFactory._registry:
        missing.append("NCCL trainer engine")
    return missing


def register_in_this_process() -> None:
    """Register our weight-transfer engines with vLLM's factory (idempotent)."""
    from rllib_grpo.weights.engines import register_engines

    register_engines()


def worker_gpu_uuid(worker: Any) -> str:
    """Run on a vLLM worker (``collective_rpc``): the UUID of the GPU it drives."""
    import torch

    return str(torch.cuda.get_device_properties(worker.device).uuid)
