"""Multi-turn GRPO end to end: a one-turn episode is exactly the single-turn path, the
environment's tokens get no gradient, and a multi-turn step runs, logs and agrees with
the learner's log-probs."""

from __future__ import annotations

import numpy as np
import torch

from rllib_grpo.data.rollout import ARRAY_FIELDS
from rllib_grpo.envs.arithmetic import make_arithmetic_records, problem_seed
from rllib_grpo.envs.datasets import PromptDataset
from rllib_grpo.envs.multiturn import MultiTurnTextEnv
from tests.conftest import tiny_config


class ArithmeticAsMultiTurn(MultiTurnTextEnv):
    """`rllib_grpo/Arithmetic-v0`'s prompts and order, played by the multi-turn machinery."""

    def __init__(self, *, max_operand: int = 9, seed: int | None = None, **kwargs):
        records = make_arithmetic_records(10_000, problem_seed(seed, None),
                                          max_operand=max_operand)
        super().__init__(PromptDataset(records, name="arithmetic"), max_turns=1, seed=seed,
                         **kwargs)


def _learner_weights(algo) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()


def _two_steps(config):
    algo = config.build_algo()
    try:
        rollouts, weights = [], []
        for _ in range(2):
            algo.train()
            rollouts.append(algo.last_rollout)
            weights.append(_learner_weights(algo))
        return rollouts, weights
    finally:
        algo.stop()


def test_a_one_turn_episode_is_exactly_the_single_turn_path(ray_session):
    single_rollouts, single_weights = _two_steps(tiny_config())
    config = tiny_config()
    config.environment(ArithmeticAsMultiTurn, env_config={"max_operand": 4})
    multi_rollouts, multi_weights = _two_steps(config)
    for single, multi in zip(single_rollouts, multi_rollouts, strict=True):
        assert single.loss_mask is None and multi.loss_mask is not None
        for name in ARRAY_FIELDS:
            np.testing.assert_array_equal(getattr(single, name), getattr(multi, name), name)
        np.testing.assert_array_equal(multi.loss_mask, multi.response_mask)
        assert [i["response"] for i in single.infos] == [i["response"] for i in multi.infos]
        assert {i["num_turns"] for i in multi.infos} == {1}
    for single, multi in zip(single_weights, multi_weights, strict=True):
        assert all(torch.equal(single[k], multi[k]) for k in single)  # bit for bit


def test_environment_tokens_get_zero_gradient():
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    config = tiny_config(prompts_per_step=1, group_size=4, entropy_coeff=0.01, use_kl_loss=True,
                         kl_loss_coef=0.1)
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    module = learner.module[DEFAULT_MODULE_ID]
    rng = np.random.default_rng(0)
    n, prompt_len, response_len = 4, 3, 8
    # model tokens | env tokens | model tokens | padding
    loss_mask = np.zeros((n, response_len), np.float32)
    loss_mask[:, :3] = loss_mask[:, 5:7] = 1
    response_mask = np.zeros((n, response_len), np.float32)
    response_mask[:, :7] = 1
    batch = {
        "prompt_ids": rng.integers(4, 18, (n, prompt_len)), "prompt_mask": np.ones((n, 3), int),
        "response_ids": rng.integers(4, 18, (n, response_len)), "response_mask": response_mask,
        "loss_mask": loss_mask, "rollout_log_probs": np.zeros((n, response_len), np.float32),
        "scores": np.array([1, 0, 0, 1], np.float32), "group_index": np.zeros(n, np.int64),
    }
    captured = []
    forward_train = module.forward_train

    def retaining_forward(*args, **kwargs):
        out = forward_train(*args, **kwargs)
        for tensor in out.values():
            tensor.retain_grad()
        captured.append(out)
        return out

    module.forward_train = retaining_forward
    learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, n))
    [out] = captured
    model_tokens = torch.as_tensor(loss_mask).bool()
    for name in ("log_probs", "entropy"):
        grad = out[name].grad
        assert (grad[~model_tokens] == 0).all(), name  # environment tokens and padding
        assert (grad[model_tokens] != 0).any(), name


def test_multi_turn_step_runs_logs_and_agrees_with_the_learner(ray_session):
    from rllib_grpo.cli.tensorboard import completions_table, flatten

    config = tiny_config(max_response_length=12, max_prompt_length=16, val_every=1,
                         val_num_prompts=2)
    config.environment("rllib_grpo/GuessNumber-v0")
    config.env_config = {"num_problems": 100}  # .environment() merges into Arithmetic's
    algo = config.build_algo()
    try:
        first = flatten(algo.train())
        rollout = algo.last_rollout
        second = flatten(algo.train())
    finally:
        algo.stop()
    for key in ("num_turns/mean", "num_turns/max", "tool_calls/success", "tool_calls/error",
                "response_length/tokens_per_turn", "episode_length/clip_ratio",
                "episode/truncated_ratio", "val-core/guess_number/acc/mean@1"):
        assert key in first, key
    assert first["num_turns/max"] > 1  # the tiny model's guesses get feedback
    assert rollout.loss_mask is not None and (rollout.loss_mask <= rollout.response_mask).all()
    assert (rollout.loss_mask < rollout.response_mask).any()  # feedback tokens: not trained
    # Later turns were sampled from the whole conversation: the learner's recomputed
    # log-probs of every model token match the sampler's.
    assert second["training/rollout_probs_diff_max"] < 1e-5
    table = completions_table(rollout.infos)
    assert "assistant:" in table and "user:" in table
