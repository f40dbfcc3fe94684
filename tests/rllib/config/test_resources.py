"""Env runners and learners reserve what their engines need, so Tune trials get the
right placement-group bundles."""

from __future__ import annotations

from tests.conftest import tiny_config


def _bundles(config):
    from rllib_grpo.rllib.algorithm.grpo import GRPO

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
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    config = tiny_config(sampler="vllm")
    config.env_runners(num_gpus_per_env_runner=0.4)
    assert engine_options(config)["gpu_memory_utilization"] == 0.36
    config.training(sampler_config={"gpu_memory_utilization": 0.2})
    assert engine_options(config)["gpu_memory_utilization"] == 0.2  # explicit wins
    assert "gpu_memory_utilization" not in engine_options(tiny_config(sampler="hf"))


def _tensor_parallel_config(tp: int = 2, **training):
    config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp}, **training)
    config.env_runners(num_env_runners=2, num_gpus_per_env_runner=tp,
                       create_local_env_runner=False)
    config.learners(num_learners=1, num_gpus_per_learner=1)
    return config


def test_tensor_parallel_env_runners_reserve_a_multi_gpu_bundle_each():
    """verl's rollout.tensor_model_parallel_size=2: each env runner's placement bundle
    holds the 2 GPUs its vLLM engine spreads over."""
    from rllib_grpo.rllib.config.checks import find_errors

    config = _tensor_parallel_config(2)
    assert find_errors(config) == []
    bundles = _bundles(config)
    assert bundles.count({"CPU": 1, "GPU": 2}) == 2  # one 2-GPU bundle per env runner
    assert any(b.get("GPU") == 1 for b in bundles)  # the learner


def test_tensor_parallel_size_reaches_the_engine_with_its_own_executor(monkeypatch):
    """The engine runs its tensor-parallel workers itself (vLLM's multiprocessing executor
    inside the env runner's actor); weights then reach it through a file."""
    import types

    vllm = __import__("pytest").importorskip("vllm")
    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.env_runner.env_runner import engine_options
    from rllib_grpo.samplers import make_sampler

    captured = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            captured.update(kwargs)
            hf = types.SimpleNamespace(tie_word_embeddings=True)
            self.llm_engine = types.SimpleNamespace(
                model_config=types.SimpleNamespace(hf_text_config=hf))

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    config = _tensor_parallel_config(2, model_override_config={"max_position_embeddings": 64})
    options = engine_options(config)
    sampler = make_sampler("vllm", model_path=resolve_model(config.model_path), **options)
    assert captured["tensor_parallel_size"] == 2
    assert captured["distributed_executor_backend"] == "mp"
    assert captured["hf_overrides"] == {"max_position_embeddings": 64}
    assert sampler.weights_through_files


def test_tensor_parallel_layouts_that_cannot_run_are_errors():
    from rllib_grpo.rllib.config.checks import find_errors

    wrong_bundle = _tensor_parallel_config(2)
    wrong_bundle.env_runners(num_gpus_per_env_runner=1)
    assert any("num_gpus_per_env_runner=2" in e for e in find_errors(wrong_bundle))
    hf = tiny_config(sampler="hf", sampler_config={"tensor_parallel_size": 2})
    assert any("needs the vLLM sampler" in e for e in find_errors(hf))
