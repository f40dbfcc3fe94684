"""Env runners and learners reserve what their engines need, so Tune trials get the
right placement-group bundles."""

from __future__ import annotations

from tests.conftest import tiny_config


def _bundles(config):
    from rllib_grpo.rllib.algorithm import GRPO

    return GRPO.default_resource_request(config).bundles


def test_env_runner_bundles_carry_the_engine_resources():
    config = tiny_config(sampler="vllm")
    config.env_runners(num_env_runners=2, num_cpus_per_env_runner=2,
                       num_gpus_per_env_runner=0.5, create_local_env_runner=False)
    config.learners(num_learners=1, num_gpus_per_learner=1)
    bundles = _bundles(config)
    assert bundles.count({"CPU": 2, "GPU": 0.5}) == 2  # one per env runner
    assert any(b.get("GPU") == 1 for b in bundles)  # the learner


def test_colocated_engine_takes_its_share_of_gpu_memory():
    from rllib_grpo.rllib.env_runner import engine_options

    config = tiny_config(sampler="vllm")
    config.env_runners(num_gpus_per_env_runner=0.4)
    assert engine_options(config)["gpu_memory_utilization"] == 0.36
    config.training(sampler_config={"gpu_memory_utilization": 0.2})
    assert engine_options(config)["gpu_memory_utilization"] == 0.2  # explicit wins
    assert "gpu_memory_utilization" not in engine_options(tiny_config(sampler="hf"))
