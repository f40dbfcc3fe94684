"""Arithmetic scorer: the last number in the response equals the integer ground truth.

Accepts ``7``, ``= 7``, ``7.``, ``#### 7``, ``-3`` and ``−3`` (unicode minus).
"""

from __future__ import annotations

from typing import Any

from rllib_grpo.rewards._numbers import answers_match, last_number
from rllib_grpo.rewards.pool import declare_isolation


@declare_isolation("inline")  # time linear in the response: runs inline
def score_arithmetic(solution_str: str, ground_truth: Any) -> dict:
    """Score 1.0 when the last number of ``solution_str`` equals ``ground_truth``."""
    pred = last_number(solution_str)
    acc = pred is not None and answers_match(pred, ground_truth)
    return {"score": float(acc), "acc": acc, "pred": pred}
