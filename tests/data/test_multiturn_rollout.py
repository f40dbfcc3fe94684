"""Episodes of a step as token sequences: loss mask, batched turns, seeds, limits, metrics.

A scripted sampler stands in for the model (no torch, no Ray), so every token is known.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rllib_grpo.data.rollout import concat_rollouts, data_metrics
from rllib_grpo.data.trajectory import EpisodeLimits
from rllib_grpo.envs.guess_number import GuessNumberEnv
from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.rllib.config.checks import find_errors
from rllib_grpo.rllib.env_runner.episode_sampler import (
    EpisodeSampler,
    check_multi_turn_config,
    episode_seed,
)
from rllib_grpo.samplers import SamplingParams
from tests.helpers.scripted_agents import (
    TOKENIZER,
    ScriptedSampler,
    binary_search,
    calculator_agent,
    reset_prompts,
)


def _run(env, script, limits, *, num_prompts=2, group_size=3):
    sampler = ScriptedSampler(script)
    runner = EpisodeSampler(env, sampler, TOKENIZER, limits, seed=7)
    episodes = runner.sample(reset_prompts(env, num_prompts), list(range(num_prompts)), group_size,
                             SamplingParams(max_tokens=limits.max_response_length))
    return runner, sampler, episodes, runner.to_batch(episodes, pad_token_id=0)


def test_tool_episode_is_one_sequence_with_a_loss_mask():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER)
    _, sampler, episodes, batch = _run(env, calculator_agent, EpisodeLimits(64))
    assert batch.scores.tolist() == [1.0] * 6
    row = 0
    length = batch.response_lengths[row]
    response = batch.response_ids[row, :length].tolist()
    model = batch.loss_mask[row, :length].astype(bool)
    expression = episodes[0].prompt["text"].removesuffix("=")
    answer = str(episodes[0].prompt["ground_truth"])
    assert TOKENIZER.decode(np.asarray(response)[model]) == (
        f"<tool>calculator: {expression}</tool><eos>{answer}<eos>")
    assert TOKENIZER.decode(np.asarray(response)[~model]) == f"<result>{answer}</result>"
    # Attention covers every real token; log-probs are the sampler's on model tokens, 0 else.
    assert batch.response_mask[row, :length].all() and not batch.response_mask[row, length:].any()
    assert (batch.rollout_log_probs[row, :length][~model] == 0).all()
    assert (batch.rollout_log_probs[row, :length][model] < 0).all()
    # Turn 1 is the single-turn request (prompts x group_size); turn 2 one call for all six.
    assert [(c["num_prompts"], c["n"]) for c in sampler.calls] == [(2, 3), (6, 1)]
    assert sampler.calls[0]["seeds"] is None and len(set(sampler.calls[1]["seeds"])) == 6
    info = batch.infos[row]
    assert (info["num_turns"], info["tool_calls_ok"], info["acc"]) == (2, 1, True)
    assert "tool: <result>" in info["conversation"]
    metrics = data_metrics(batch, max_response_length=64)
    assert metrics["num_turns/mean"] == 2 and metrics["tool_calls/success"] == 6
    assert metrics["tool_calls/success_rate"] == 1.0 and metrics["episode/truncated_ratio"] == 0


def test_episode_seeds_do_not_depend_on_the_rest_of_the_batch():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER)
    _, sampler, episodes, _ = _run(env, calculator_agent, EpisodeLimits(64))
    assert [e.seed for e in episodes[:3]] == [episode_seed(7, 0, j) for j in range(3)]
    assert sampler.calls[1]["seeds"] == [episode_seed(e.seed, 1) for e in episodes]


def test_turn_limit_and_token_budget_truncate():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER)
    always_tool = lambda context: "<tool>calculator: 1+1</tool>"  # noqa: E731
    _, _, _, batch = _run(env, always_tool, EpisodeLimits(200, max_turns=2))
    assert [i["truncation"] for i in batch.infos] == ["turn_limit"] * 6
    assert batch.truncated.all() and (batch.scores == 0).all()
    assert [i["num_turns"] for i in batch.infos] == [2] * 6 and not batch.infos[0]["acc"]
    # A budget of 20 tokens: the 9-token call and its 3-token result fit, the second
    # call is cut at the budget.
    _, sampler, _, batch = _run(env, always_tool, EpisodeLimits(20))
    assert (batch.response_lengths == 20).all() and batch.truncated.all()
    assert [i["truncation"] for i in batch.infos] == ["token_budget"] * 6
    assert [c["max_tokens"] for c in sampler.calls] == [20, 8]
    metrics = data_metrics(batch, max_response_length=20)
    assert metrics["episode_length/clip_ratio"] == 1.0


def test_env_turn_limit_and_observation_cut():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER, max_turns=3)
    always_tool = lambda context: "<tool>calculator: 123*456</tool>"  # noqa: E731
    _, _, _, batch = _run(env, always_tool, EpisodeLimits(200, max_observation_tokens=4))
    row_env = batch.response_ids[0][batch.loss_mask[0] == 0][: batch.response_lengths[0]]
    assert TOKENIZER.decode(row_env[:4]) == "<result>560"  # cut to 4 tokens
    assert [i["truncation"] for i in batch.infos] == ["turn_limit"] * 6


def test_per_turn_rewards_are_discounted_by_gamma():
    env = GuessNumberEnv(num_problems=20, seed=0, tokenizer=TOKENIZER)
    _, _, _, batch = _run(env, binary_search, EpisodeLimits(48, gamma=0.5), group_size=1,
                          num_prompts=6)
    turns = np.asarray([i["num_turns"] for i in batch.infos])
    assert (batch.scores == 0.5 ** (turns - 1)).all() and len(set(turns)) > 1
    assert all(i["acc"] for i in batch.infos)


def test_batches_with_and_without_loss_masks_concatenate():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER)
    _, _, _, multi = _run(env, calculator_agent, EpisodeLimits(64), num_prompts=1)
    single = multi.select([0, 1])
    single.loss_mask = None
    both = concat_rollouts([single, multi], pad_token_id=0)
    assert both.loss_mask.shape == both.response_mask.shape
    np.testing.assert_array_equal(both.loss_mask[:2], both.response_mask[:2])
    assert "loss_mask" in both.train_columns() and "loss_mask" not in single.train_columns()


def test_limits_and_estimators_are_checked():
    with pytest.raises(ValueError, match="max_turns=0"):
        EpisodeLimits(10, max_turns=0)
    with pytest.raises(ValueError, match="remax"):
        check_multi_turn_config(SimpleNamespace(adv_estimator="remax"))
    from tests.conftest import tiny_config

    errors = find_errors(tiny_config(max_tokens_per_turn=8, max_response_length=4, max_turns=0))
    assert any("max_tokens_per_turn=8 exceeds" in e for e in errors)
    assert any(e.startswith("max_turns=0") for e in errors)


def test_verl_multi_turn_command_line_maps():
    from rllib_grpo.cli.build import assemble, build_config

    exp = assemble(overrides=["actor_rollout_ref.rollout.multi_turn.enable=True",
                              "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                              "actor_rollout_ref.rollout.multi_turn.max_tool_response_length=64"],
                   env="rllib_grpo/ToolArithmetic-v0")
    config = build_config(exp)
    assert (config.max_turns, config.max_observation_tokens) == (3, 64)
    assert "actor_rollout_ref.rollout.multi_turn.enable" in exp.ignored
