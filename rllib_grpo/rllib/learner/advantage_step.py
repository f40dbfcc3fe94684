"""The learner's advantage step: scores -> token rewards -> (in-reward KL) -> advantages.

On this learner's rows (whole groups), before the update, as verl's driver does between
the old-log-prob pass and the actor update (``apply_kl_penalty``, ``compute_advantage``,
DAPO's overlong filtering).  Collective when the batch is split over learners: the
in-reward KL controller sees the whole step's KL, and batch-wide estimators every
learner's shard (``all_reduce``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from rllib_grpo.algos import KLController, compute_advantage, kl_penalty, scores_to_tokens
from rllib_grpo.rllib.learner.distributed import all_reduce


class StepAdvantages(NamedTuple):
    """What the advantage step gives the update and the metrics; tensors (B, R)."""

    token_rewards: torch.Tensor  # scores on the last token, minus the in-reward KL
    advantages: torch.Tensor
    returns: torch.Tensor
    loss_mask: torch.Tensor | None  # without the cut responses; None: no overlong filtering
    metrics: dict[str, float]  # actor/reward_kl_penalty*, response/truncated_masked_frac


def kl_in_reward(token_scores: torch.Tensor, old_log_probs: torch.Tensor,
                 ref_log_probs: torch.Tensor, mask: torch.Tensor, kl_ctrl: KLController,
                 estimator: str) -> tuple[torch.Tensor, dict[str, float]]:
    """verl's ``apply_kl_penalty``: token rewards ``scores - beta * KL(old || ref)`` (B, R),
    with the controller's coefficient before it sees this step's KL; then the controller
    is updated with the step's mean per-sequence KL (summed over learners: collective)."""
    kld = kl_penalty(old_log_probs, ref_log_probs, estimator) * mask
    beta = kl_ctrl.value
    per_seq = (kld * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    # The controller must see the KL of the whole step, so sum over learners.
    totals = all_reduce(torch.stack([per_seq.sum(), per_seq.new_tensor(float(len(per_seq)))]))
    current_kl = (totals[0] / totals[1].clamp(min=1)).item()
    kl_ctrl.update(current_kl, n_steps=int(totals[1].item()))
    metrics = {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
    return token_scores - beta * kld, metrics


def step_advantages(batch: dict[str, torch.Tensor], mask: torch.Tensor, config: Any,
                    kl_ctrl: KLController) -> StepAdvantages:
    """Advantages of ``batch`` over ``mask`` (B, R: the loss mask before truncation).

    ``batch`` holds ``scores`` and ``group_index`` (B,), ``truncated`` (B,) with
    ``mask_truncated_completions``, ``reward_baselines`` (B,) for remax, and
    ``old_log_probs`` / ``ref_log_probs`` (B, R) with ``use_kl_in_reward``.
    """
    c = config
    metrics: dict[str, float] = {}
    token_rewards = scores_to_tokens(batch["scores"].float(), mask)
    if c.use_kl_in_reward:
        token_rewards, metrics = kl_in_reward(token_rewards, batch["old_log_probs"],
                                              batch["ref_log_probs"], mask, kl_ctrl, c.kl_penalty)
    advantages, returns = compute_advantage(
        c.adv_estimator, token_rewards, mask,
        group_ids=batch["group_index"].cpu().numpy(),
        norm_adv_by_std_in_grpo=c.norm_adv_by_std_in_grpo, gamma=c.gamma,
        reward_baselines=batch["reward_baselines"] if c.adv_estimator == "remax" else None,
        reduce_sum=all_reduce,  # batch-wide estimators see every learner's shard
    )
    loss_mask = None
    if c.mask_truncated_completions:
        # DAPO "overlong filtering": cut responses stay in their group's statistics
        # but contribute no loss.
        keep = (~batch["truncated"].bool()).float()
        loss_mask = mask * keep[:, None]
        metrics["response/truncated_masked_frac"] = 1.0 - keep.mean().item()
    return StepAdvantages(token_rewards, advantages, returns, loss_mask, metrics)
