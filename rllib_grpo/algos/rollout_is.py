"""Truncated importance sampling of the rollout/trainer gap (verl's
``algorithm.rollout_correction``): weights pi_old / pi_rollout that correct the loss for
samples drawn by other weights or other kernels than the learner's."""

from __future__ import annotations

import torch

ROLLOUT_IS_LEVELS = ("token", "sequence")  # verl's algorithm.rollout_correction.rollout_is
SAFETY_BOUND = 20.0  # |log ratio| cap before exp (verl's SAFETY_BOUND)


def truncated_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor,
                         mask: torch.Tensor, threshold: float, level: str = "token"
                         ) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights pi_old / pi_rollout truncated at ``threshold``, zero off ``mask``:
    (B, R) -> (B, R), and their metrics over the masked tokens (verl's
    ``compute_rollout_correction_weights``).

    ``level`` 'token': each token's own ratio; 'sequence': the product of the ratios of the
    sequence's masked tokens (exp of their summed log-ratio), one weight for all its tokens.
    Log-ratios are capped at +-20 before the exp.  Rows are independent, so the weights of a
    micro-batch equal those of the whole batch (the on-policy shortcut computes them there).
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is={level!r} is unknown; use one of {ROLLOUT_IS_LEVELS}.")
    log_ratio = old_log_probs.float() - rollout_log_probs.float()
    if level == "sequence":
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)
    raw = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND).exp()
    weights = raw.clamp(max=threshold) * mask
    valid = mask.bool()
    if not valid.any():
        return weights, {}
    return weights, {
        "rollout_corr/is_weight_mean": weights[valid].mean().item(),
        "rollout_corr/is_truncated_frac": (raw[valid] > threshold).float().mean().item(),
    }
