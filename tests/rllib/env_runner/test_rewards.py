"""The env runner's reward mixture: built from the config on the env, fed prompts, logged
per name."""

from __future__ import annotations

import pytest

from rllib_grpo.rllib.config.grpo_config import GRPOConfig
from rllib_grpo.rllib.config.text_env import make_text_env
from rllib_grpo.rllib.env_runner.rewards import install_reward_mixture, reward_metrics
from tests.helpers.reward_server import RewardServer, openrlhf_handler


def half(data_source, solution_str, ground_truth, extra_info=None):
    return 0.5


@pytest.fixture
def server():
    s = RewardServer(openrlhf_handler)
    yield s
    s.close()


def test_the_mixture_scores_env_function_and_remote_rewards_with_prompts(server):
    config = GRPOConfig().environment("rllib_grpo/Arithmetic-v0", env_config={
        "max_operand": 4}).training(reward_funcs=["env", half, server.url],
                                    reward_weights=[1.0, 2.0, 0.5])
    env = make_text_env(config, None, 0, overrides={"max_prompt_length": None})
    install_reward_mixture(env, config)
    prompt, info = env.reset()
    infos = env.score_many([(info["index"], str(info["ground_truth"])), (info["index"], "x")])
    assert len(server.requests) == 1  # one POST for the batch, with the prompts
    assert server.requests[0][1]["prompts"] == [prompt, prompt]
    remote = [float(len(prompt) + len(r)) for r in (str(info["ground_truth"]), "x")]
    assert [i["score"] for i in infos] == [1.0 + 1.0 + 0.5 * remote[0], 0.0 + 1.0 + 0.5 * remote[1]]
    assert reward_metrics(infos) == {"reward/env/mean": 0.5, "reward/half/mean": 0.5,
                                     "reward/remote/mean": sum(remote) / 2}


def test_no_reward_funcs_leaves_the_env_reward_alone():
    config = GRPOConfig()
    env = make_text_env(config, None, 0, overrides={"max_prompt_length": None})
    scorer = env.scorer
    install_reward_mixture(env, config)
    assert env.scorer is scorer


def test_a_model_reward_outside_an_algorithm_says_how_to_build_it():
    config = GRPOConfig().training(reward_funcs=["builtin:tiny-rm"])
    env = make_text_env(config, None, 0, overrides={"max_prompt_length": None})
    with pytest.raises(RuntimeError, match="build_algo"):
        install_reward_mixture(env, config)
