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


def test_tensor_parallel_env_runners_reserve_a_gpu_bundle_per_shard():
    """verl's rollout.tensor_model_parallel_size=2: each env runner's engine spreads over
    2 GPUs, one bundle of one GPU each (vLLM's Ray executor takes no bigger bundle); the
    env runner itself holds a CPU bundle."""
    from rllib_grpo.rllib.config.checks import find_errors

    config = _tensor_parallel_config(2)
    assert find_errors(config) == []
    bundles = _bundles(config)
    assert bundles.count({"CPU": 1.0}) == 3  # main process, 2 env runners
    assert bundles.count({"GPU": 1.0}) == 5  # 2 engines x TP 2, and the learner


def _fake_vllm_engine(monkeypatch, vllm) -> dict:
    """Replace ``vllm.LLM`` by a stand-in that records its keyword arguments (returned)."""
    import types

    captured: dict = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            captured.update(kwargs)
            hf = types.SimpleNamespace(tie_word_embeddings=True)
            self.llm_engine = types.SimpleNamespace(
                model_config=types.SimpleNamespace(hf_text_config=hf))

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    return captured


def test_tensor_parallel_size_reaches_the_engine_with_rays_executor(monkeypatch):
    """The engine's tensor-parallel workers are Ray actors of vLLM's Ray executor, in the
    bundles the run's placement plan gives them; weights then reach it through a file."""

    vllm = __import__("pytest").importorskip("vllm")
    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.env_runner.env_runner import engine_options
    from rllib_grpo.samplers import make_sampler

    captured = _fake_vllm_engine(monkeypatch, vllm)
    config = _tensor_parallel_config(2, model_override_config={"max_position_embeddings": 64})
    options = engine_options(config)
    sampler = make_sampler("vllm", model_path=resolve_model(config.model_path), **options)
    assert captured["tensor_parallel_size"] == 2
    assert captured["distributed_executor_backend"] == "ray"
    assert captured["hf_overrides"] == {"max_position_embeddings": 64}
    assert sampler.weights_through_files


def test_tensor_parallel_layouts_that_cannot_run_are_errors():
    from rllib_grpo.rllib.config.checks import find_errors

    wrong_bundle = _tensor_parallel_config(2)
    wrong_bundle.env_runners(num_gpus_per_env_runner=1)
    assert any("num_gpus_per_env_runner=2" in e for e in find_errors(wrong_bundle))
    hf = tiny_config(sampler="hf", sampler_config={"tensor_parallel_size": 2})
    assert any("needs the vLLM sampler" in e for e in find_errors(hf))


def test_engine_plans_for_the_prompt_and_response_budget():
    """vLLM sized for the model's whole context refuses to start in a small memory share:
    it gets the prompt + response budget (a multi-turn episode's too), capped by the
    model's context."""
    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    config = tiny_config(sampler="vllm", max_prompt_length=16, max_response_length=12)
    assert engine_options(config)["max_model_len"] == 28
    assert engine_options(config, resolve_model("builtin:tiny"))["max_model_len"] == 28
    long = tiny_config(sampler="vllm", max_prompt_length=100, max_response_length=100)
    assert engine_options(long, resolve_model("builtin:tiny"))["max_model_len"] == 128
    stretched = tiny_config(sampler="vllm", max_prompt_length=100, max_response_length=100,
                            model_override_config={"max_position_embeddings": 512})
    assert engine_options(stretched, resolve_model("builtin:tiny"))["max_model_len"] == 200
    asked = tiny_config(sampler="vllm", sampler_config={"max_model_len": 64})
    assert engine_options(asked)["max_model_len"] == 64
    assert "max_model_len" not in engine_options(tiny_config(sampler="hf"))


def test_gpu_engines_get_the_share_the_runner_holds_and_sleep_only_when_colocated():
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    whole = tiny_config(sampler="vllm")
    whole.env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    whole.learners(num_gpus_per_learner=1)
    options = engine_options(whole)
    assert "gpu_memory_utilization" not in options  # vLLM's default, not 0.5
    assert "enable_sleep_mode" not in options and not whole.sampler_sleeps
    colocated = tiny_config(sampler="vllm").learners(num_gpus_per_learner=1)
    assert colocated.sampler_sleeps
    options = engine_options(colocated)
    assert options["enable_sleep_mode"] and options["gpu_memory_utilization"] == 0.5
    assert not tiny_config(sampler="vllm").sampler_sleeps  # a CPU learner: nothing to share


def test_requests_are_seeded_only_when_the_config_has_a_seed():
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    assert engine_options(tiny_config(sampler="vllm"))["seed_requests"]  # tiny_config: seed=0
    assert not engine_options(tiny_config(sampler="vllm").debugging(seed=None))["seed_requests"]


def test_a_cpu_engine_holds_the_sequences_a_runner_samples_at_once(monkeypatch):
    """On CPU vLLM's KV cache is sized for ``max_num_seqs`` sequences and touched at start:
    the engine gets the runner's share of a step (continuous rollouts: max_staleness
    steps' worth), not vLLM's 256; ``sampler_config`` still decides where it is set."""

    vllm = __import__("pytest").importorskip("vllm")
    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.config.memory import sequences_at_once
    from rllib_grpo.rllib.env_runner.env_runner import engine_options
    from rllib_grpo.samplers import make_sampler
    from rllib_grpo.samplers.vllm_engine import cpu_kv_cache_bytes

    config = tiny_config(sampler="vllm", prompts_per_step=6, group_size=4)
    assert engine_options(config)["cpu_max_num_seqs"] == sequences_at_once(config) == 24
    config.env_runners(num_env_runners=4)
    assert sequences_at_once(config) == 6
    continuous = tiny_config(sampler="vllm", prompts_per_step=6, group_size=4,
                             rollout_mode="continuous", max_staleness=2)
    continuous.env_runners(num_env_runners=4)
    assert sequences_at_once(continuous) == 12

    captured = _fake_vllm_engine(monkeypatch, vllm)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    path = resolve_model("builtin:tiny")
    local = tiny_config(sampler="vllm", prompts_per_step=6, group_size=4)
    options = engine_options(local, path)
    make_sampler("vllm", model_path=path, **options)
    assert captured["max_num_seqs"] == 24
    assert captured["kv_cache_memory_bytes"] == cpu_kv_cache_bytes(
        path, None, options["max_model_len"], 24)
    asked = tiny_config(sampler="vllm", sampler_config={"max_num_seqs": 64})
    make_sampler("vllm", model_path=path, **engine_options(asked, path))
    assert captured["max_num_seqs"] == 64
