"""Which sampler an env runner makes and with which options: the config's, but where the
GPUs are fake (`RLLIB_GRPO_FAKE_GPUS=1`) the transformers sampler on the CPU with the
options it knows."""

from __future__ import annotations

from tests.conftest import tiny_config


def test_fake_gpus_swap_the_vllm_engine_for_the_transformers_sampler(monkeypatch):
    from rllib_grpo.rllib.env_runner.engine import engine_options, sampler_kind
    from rllib_grpo.rllib.placement import FAKE_GPUS_VARIABLE

    config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": 2,
                                                         "max_batch_size": 8},
                         prompts_per_step=8,
                         model_override_config={"max_position_embeddings": 64}).colocate(4)
    monkeypatch.delenv(FAKE_GPUS_VARIABLE, raising=False)
    assert sampler_kind(config) == "vllm"
    real = engine_options(config)
    assert real["tensor_parallel_size"] == 2 and real["enable_sleep_mode"]
    monkeypatch.setenv(FAKE_GPUS_VARIABLE, "1")
    assert sampler_kind(config) == "hf"
    stand_in = engine_options(config, kind=sampler_kind(config))
    # Only what the transformers sampler takes: no TP, no sleep mode, no memory share.
    assert stand_in == {"max_batch_size": 8,
                        "config_overrides": {"max_position_embeddings": 64}}
    assert sampler_kind(tiny_config(sampler="hf")) == "hf"


def test_no_stand_in_shards_without_fake_gpus_or_for_an_engine_of_tp_one(monkeypatch):
    from rllib_grpo.rllib.placement import BUNDLES_VARIABLE, FAKE_GPUS_VARIABLE, hold_engine_shards

    monkeypatch.setenv(BUNDLES_VARIABLE, "1,2")
    monkeypatch.delenv(FAKE_GPUS_VARIABLE, raising=False)
    assert hold_engine_shards(1.0) == []  # real GPUs: vLLM's Ray executor starts them
    monkeypatch.setenv(FAKE_GPUS_VARIABLE, "1")
    monkeypatch.delenv(BUNDLES_VARIABLE)
    assert hold_engine_shards(1.0) == []  # TP 1: the engine is the env runner
