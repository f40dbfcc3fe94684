"""The rollout-vs-trainer gap: how far the sampler's log-probs are from the learner's.

verl's ``training/rollout_*`` metrics (DESIGN: always logged), over the real response
tokens of a batch; with asynchronous rollouts (``max_staleness`` >= 1) also split by the
staleness of the trajectories (learner version minus the version that sampled them), as
``training/rollout_log_probs_diff_max/staleness_<k>`` and
``training/rollout_probs_diff_mean/staleness_<k>``: at staleness 0 the gap is numerics
only (sampler vs trainer kernels), at staleness k >= 1 it also holds k policy updates.
`rllib_grpo.algos.rollout_is.truncated_is_weights` corrects the loss for the gap (verl ``rollout_is`` "token" or
"sequence").
"""

from __future__ import annotations

from typing import Any

import torch

from rllib_grpo.algos.rollout_is import truncated_is_weights


def rollout_gap_metrics(rollout_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                        valid: torch.Tensor, staleness: torch.Tensor | None = None
                        ) -> dict[str, float]:
    """Gap metrics of (trajectories, response tokens) log-probs over the ``valid`` tokens.

    ``staleness`` (per trajectory, in learner updates) adds the per-staleness split.
    """
    rollout_p = rollout_log_probs.float()[valid].exp()
    trainer_p = old_log_probs[valid].exp()
    if rollout_p.numel() == 0:
        return {}
    diff = (rollout_p - trainer_p).abs()
    log_diff = (rollout_log_probs.float() - old_log_probs).abs()
    metrics = {
        "training/rollout_probs_diff_mean": diff.mean().item(),
        "training/rollout_probs_diff_max": diff.max().item(),
        "training/rollout_log_probs_diff_max": log_diff[valid].max().item(),
    }
    if rollout_p.numel() > 1 and rollout_p.std() > 0 and trainer_p.std() > 0:
        corr = torch.corrcoef(torch.stack([rollout_p, trainer_p]))[0, 1]
        metrics["training/rollout_actor_probs_pearson_corr"] = corr.item()
    if staleness is not None:
        prob_diff = (rollout_log_probs.float().exp() - old_log_probs.exp()).abs()
        for k in torch.unique(staleness).tolist():
            tokens = valid & (staleness == k)[:, None]
            if tokens.any():
                suffix = f"/staleness_{int(k)}"
                metrics["training/rollout_log_probs_diff_max" + suffix] = \
                    log_diff[tokens].max().item()
                metrics["training/rollout_probs_diff_mean" + suffix] = \
                    prob_diff[tokens].mean().item()
    return metrics


def rollout_correction(batch: dict[str, torch.Tensor], mask: torch.Tensor, config: Any,
                       metrics: bool = True) -> tuple[torch.Tensor | None, dict[str, float]]:
    """What the learner takes from the sampler's log-probs of ``batch`` over ``mask`` (B, R):
    the ``rollout_is`` weights (None when it is off) and, with ``metrics``, the gap metrics
    over ``mask`` (split by staleness under ``max_staleness``) and the weights' metrics.

    ``batch`` holds ``old_log_probs``, ``rollout_log_probs`` and, with
    asynchronous rollouts, ``staleness`` (per row); without ``rollout_log_probs`` (a sampler
    that returns none) there is nothing to compare.
    """
    if "rollout_log_probs" not in batch:
        return None, {}
    old, rollout = batch["old_log_probs"].detach(), batch["rollout_log_probs"]
    out: dict[str, float] = {}
    if metrics:
        staleness = batch.get("staleness") if getattr(config, "max_staleness", 0) else None
        out = rollout_gap_metrics(rollout, old, mask.bool(), staleness)
    if not config.rollout_is:
        return None, out
    weights, weight_metrics = truncated_is_weights(old, rollout, mask,
                                                   config.rollout_is_threshold, config.rollout_is)
    return weights, {**out, **weight_metrics} if metrics else out
