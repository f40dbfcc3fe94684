"""Multi-turn episodes in the continuous loop (`EpisodeGroups`), against a fake stream that
samples one token per engine step: the batch is token for token, mask for mask what the
synchronous `EpisodeSampler` builds for the same episodes; tokens carry the version that
sampled them, so episodes whose turns span a weight update carry two versions; env tokens
are not trained on and do not make an episode older."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_grpo.data.rollout import ARRAY_FIELDS, concat_rollouts
from rllib_grpo.data.trajectory import EpisodeLimits
from rllib_grpo.envs.guess_number import GuessNumberEnv
from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.rllib.env_runner.continuous_episodes import EpisodeGroups
from rllib_grpo.rllib.env_runner.episode_sampler import EpisodeSampler, episode_seed
from rllib_grpo.samplers import SamplingParams
from tests.helpers.continuous_runner import FakeStream, fake_runner, take_all
from tests.helpers.scripted_agents import (
    TOKENIZER,
    ScriptedSampler,
    binary_search,
    calculator_agent,
    reset_prompts,
)


def always_tool(context: str) -> str:
    return "<tool>calculator: 1+1</tool>"


CASES = {
    "tool calls": (ToolArithmeticEnv, calculator_agent, EpisodeLimits(64)),
    "token budget": (ToolArithmeticEnv, always_tool, EpisodeLimits(20)),
    "turns of different counts": (GuessNumberEnv, binary_search, EpisodeLimits(48, gamma=0.5)),
}


def _sync(env_class, script, limits, prompts, group_size):
    env = env_class(num_problems=20, seed=0, tokenizer=TOKENIZER)
    sampler = EpisodeSampler(env, ScriptedSampler(script), TOKENIZER, limits, seed=7)
    episodes = sampler.sample(prompts, list(range(len(prompts))), group_size,
                              SamplingParams(max_tokens=limits.max_response_length))
    return sampler.to_batch(episodes, pad_token_id=0)


def _continuous(env_class, script, limits, prompts, group_size, updates_at=(5, 12)):
    env = env_class(num_problems=20, seed=0, tokenizer=TOKENIZER)
    stream = FakeStream(script)
    groups = EpisodeGroups(EpisodeSampler(env, stream.sampler, TOKENIZER, limits, seed=7),
                           group_size, SamplingParams(max_tokens=limits.max_response_length),
                           pad_token_id=0, score_adjustment=lambda n, info: 0.0)
    for key, prompt in enumerate(prompts):
        for request in groups.start(key, prompt, seed=100 * key):
            stream.submit(request[0], request[1], 1, request[2], request[3])
    done, steps = {}, 0
    while groups.num_groups:
        steps += 1
        if steps in updates_at:  # a weight update between two engine steps
            stream.version += 1
        requests, finished = groups.advance(stream.step())
        for stream_key, context, params, seed in requests:
            stream.submit(stream_key, context, 1, params, seed)
        done.update(finished)
        assert steps < 1000
    return [done[key] for key in range(len(prompts))], stream


@pytest.mark.parametrize("case", list(CASES))
def test_continuous_episodes_build_the_synchronous_batch(case):
    env_class, script, limits = CASES[case]
    prompts = reset_prompts(env_class(num_problems=20, seed=0, tokenizer=TOKENIZER), 4)
    group_size = 3
    sync = _sync(env_class, script, limits, prompts, group_size)
    batches, stream = _continuous(env_class, script, limits, prompts, group_size)
    for key, batch in enumerate(batches):  # one batch per group, as it finished
        assert (batch.group_index == key).all()
    batch = concat_rollouts(batches, pad_token_id=0)  # (a group pads to its longest row)
    for name in ARRAY_FIELDS:
        if name != "weights_version":
            np.testing.assert_array_equal(getattr(batch, name), getattr(sync, name), name)
    np.testing.assert_array_equal(batch.loss_mask, sync.loss_mask)
    for field in ("num_turns", "conversation", "truncation", "turn_rewards", "reward"):
        assert [i[field] for i in batch.infos] == [i[field] for i in sync.infos], field
    # Seeds: request j of a group's first turns is seed + j, later turns (episode, turn).
    first = [(key, seed) for key, _, _, seed in stream.submitted if key[2] == 0]
    assert first == [((g, j, 0), 100 * g + j) for g in range(4) for j in range(group_size)]
    later = [(key, seed) for key, _, _, seed in stream.submitted if key[2] > 0]
    assert all(seed == episode_seed(episode_seed(7, key[0], key[1]), key[2])
               for key, seed in later)


def test_turns_spanning_a_weight_update_carry_two_versions():
    env_class, script, limits = CASES["tool calls"]
    prompts = reset_prompts(env_class(num_problems=20, seed=0, tokenizer=TOKENIZER), 2)
    batches, _ = _continuous(env_class, script, limits, prompts, 2, updates_at=(5, 12))
    spanning = 0
    for batch in batches:
        assert batch.token_versions is not None
        for row in range(len(batch)):
            n = batch.response_lengths[row]
            versions = batch.token_versions[row, :n]
            model = batch.loss_mask[row, :n] > 0
            # The episode's version is its oldest sampled token's ...
            assert batch.weights_version[row] == versions[model].min()
            spanning += len(set(versions[model].tolist())) > 1
            # ... and an env token carries the version of the model token before it.
            for i in np.flatnonzero(~model):
                assert i > 0 and versions[i] == versions[i - 1]
    assert spanning > 0


def test_the_loop_plays_episodes_and_a_suspend_restarts_the_unfinished_ones():
    """A `RolloutLoop` thread on a multi-turn env queues each group once, with its data
    position, when its episodes are done; a suspend drops the running
    groups (none is queued later) and the next submit starts them again."""
    from rllib_grpo.rllib.env_runner.rollout_loop import RolloutLoop

    runner, stream = fake_runner(calculator_agent, EpisodeLimits(64), group_size=2)
    loop = RolloutLoop(runner)
    try:
        assert loop.submit([4, 5]) == 2
        done = take_all(loop, 2)
        assert sorted(position for position, _ in done) == [4, 5]
        for _, batch in done:  # two turns each: a tool call and the answer
            assert [i["num_turns"] for i in batch.infos] == [2, 2]
            assert batch.token_versions is not None and (batch.weights_version == 0).all()
        loop.pause()  # (the fake steps nothing while paused: turns stay in flight)
        loop.submit([6, 7])
        assert loop.running_groups == 2
        loop.suspend()
        assert loop.running_groups == 0 and stream.num_requests == 0
        runner._weights_seq_no = 1
        loop.resume()  # starts the suspended positions again, under version 1
        done = take_all(loop, 2)
        assert sorted(position for position, _ in done) == [6, 7]
        assert all((batch.weights_version == 1).all() for _, batch in done)
        assert loop.take(wait_s=0.2)["groups"] == []  # nothing queued twice
    finally:
        loop.close()
