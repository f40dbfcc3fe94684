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
# The first vLLM with ``reload_weights(weights_iterator=...)`` (the layerwise reload, vLLM
# PR #32133); pyproject's ``[vllm]`` extra pins the same (a test keeps them equal).
MIN_VLLM = "0.16"


def require_layerwise_reload() -> None:
    """Refuse, at start-up, a vLLM whose workers cannot ``reload_weights`` from an iterator
    or have no weight-transfer API (every sync would fail)."""
    import vllm
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.gpu_worker import Worker

    reload = getattr(GPUModelRunner, "reload_weights", None)
    if (reload is None or "weights_iterator" not in inspect.signature(reload).parameters
            or not hasattr(Worker, "init_weight_transfer_engine")):
        raise RuntimeError(
            f"vLLM {getattr(vllm, '__version__', '?')} has no reload_weights(weights_iterator="
            f"...) or no weight-transfer API, which weight syncs go through: install "
            f"vllm>={MIN_VLLM} (pip install 'rllib-grpo[vllm]').")


def register_in_this_process() -> None:
    """Register our weight-transfer engines with vLLM's factory (idempotent)."""
    from rllib_grpo.weights.engines import register_engines

    register_engines()


def worker_gpu_uuid(worker: Any) -> str:
    """Run on a vLLM worker (``collective_rpc``): the UUID of the GPU it drives."""
    import torch

    return str(torch.cuda.get_device_properties(worker.device).uuid)
