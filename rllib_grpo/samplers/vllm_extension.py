"""vLLM's ``worker_extension_cls`` for `VLLMSampler` engines: vLLM imports this module in
each worker process before the worker loads the model and creates its weight-transfer
engine, so importing it registers our engines with vLLM's factory there (the ``grpo``
backend every sampler engine starts with is ours)."""

from __future__ import annotations

from rllib_grpo.samplers.vllm_worker import register_in_this_process

register_in_this_process()


class WeightSyncExtension:
    """Mixed into vLLM's worker class; adds no methods (the worker's own weight-transfer
    methods do the work)."""
