"""Reward shaping applied to scores before advantages: DAPO's overlong penalty, and the
placement of a sequence's score on its last token."""

from __future__ import annotations

import torch


def overlong_penalty(
    response_lengths: torch.Tensor,
    max_response_length: int,
    buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:
    """DAPO's soft overlong punishment, (B,) -> (B,), added to the score.

    ``expected = max_response_length - buffer_len``; the penalty is
    ``min(-(L - expected) / buffer_len * penalty_factor, 0)``: 0 up to ``expected``
    tokens, falling linearly to ``-penalty_factor`` at ``max_response_length``.
    """
    if buffer_len <= 0:
        raise ValueError(f"overlong buffer_len must be > 0, got {buffer_len}")
    if buffer_len > max_response_length:
        raise ValueError(
            f"overlong buffer_len={buffer_len} exceeds max_response_length={max_response_length}"
        )
    expected = max_response_length - buffer_len
    exceed = response_lengths.float() - expected
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def scores_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's scalar score on its last valid token: (B,), (B, R) -> (B, R).

    The last position where ``mask`` is 1 (index 0 for an empty row), so a multi-turn loss
    mask, with holes where the environment's tokens are, puts the score on the model's last
    token.
    """
    token_scores = torch.zeros_like(mask)
    positions = torch.arange(mask.shape[-1], device=mask.device)
    last = torch.where(mask > 0, positions, -1).max(-1).values.clamp(min=0)
    token_scores[torch.arange(len(scores)), last] = scores
    return token_scores
