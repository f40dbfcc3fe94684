"""Reward shaping applied to scores before advantages: DAPO's overlong penalty."""

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
