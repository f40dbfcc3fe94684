"""The learner's advantage step and critic metrics, without a model."""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.algos import compute_advantage, get_kl_controller, scores_to_tokens
from rllib_grpo.rllib.learner.advantage_step import step_advantages
from rllib_grpo.rllib.learner.perf import critic_metrics
from tests.conftest import tiny_config


def _batch() -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], dtype=torch.float32)
    batch = {"scores": torch.tensor([1.0, 0.0, 0.5, 0.0]),
             "group_index": torch.tensor([0, 0, 0, 0]),
             "truncated": torch.tensor([False, False, True, False]),
             "reward_baselines": torch.zeros(4)}
    return batch, mask


def test_overlong_filtering_masks_the_loss_but_keeps_the_group_statistics():
    batch, mask = _batch()
    config = tiny_config(mask_truncated_completions=True)
    step = step_advantages(batch, mask, config, get_kl_controller("fixed", kl_coef=0.0))
    expected, _ = compute_advantage("grpo", scores_to_tokens(batch["scores"], mask), mask,
                                    group_ids=batch["group_index"].numpy())
    torch.testing.assert_close(step.advantages, expected, rtol=0, atol=0)
    assert step.loss_mask is not None
    assert step.loss_mask[2].sum() == 0 and torch.equal(step.loss_mask[:2], mask[:2])
    assert step.metrics == {"response/truncated_masked_frac": pytest.approx(0.25)}
    assert set(batch) == {"scores", "group_index", "truncated", "reward_baselines"}  # untouched


def test_without_filtering_there_is_no_new_loss_mask():
    batch, mask = _batch()
    step = step_advantages(batch, mask, tiny_config(mask_truncated_completions=False),
                           get_kl_controller("fixed", kl_coef=0.0))
    assert step.loss_mask is None and step.metrics == {}


def test_critic_metrics_cover_every_row_and_the_masked_tokens():
    batch, mask = _batch()
    rewards = scores_to_tokens(batch["scores"], mask)
    advantages = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    metrics = critic_metrics(rewards, advantages, -advantages, mask)
    assert metrics["critic/rewards/min"] == 0.0  # the empty response is a row too
    assert metrics["critic/rewards/mean"] == pytest.approx(1.5 / 4)
    assert metrics["critic/advantages/max"] == 8.0 and metrics["critic/returns/min"] == -8.0
