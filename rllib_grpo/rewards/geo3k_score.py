"""Geo3K scorer (verl's ``geo3k.compute_score``): 0.9 for the right ``\\boxed{}`` answer
plus 0.1 for the format ``<think>...</think> ... \\boxed{...}``.

The boxed answer is compared as `rllib_grpo.rewards.math_score` compares MATH answers
(normalised, then with sympy), where verl calls mathruler's ``grade_answer``.
"""

from __future__ import annotations

import re
from typing import Any

from rllib_grpo.rewards.math_score import extract_boxed, math_answers_equal
from rllib_grpo.rewards.pool import declare_isolation

FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
FORMAT_WEIGHT = 0.1


@declare_isolation("thread")  # sympy may take a while on odd answers
def score_geo3k(solution_str: str, ground_truth: Any, format_score: float = FORMAT_WEIGHT
                ) -> dict:
    """``(1 - format_score) * acc + format_score * format`` (verl's weights by default)."""
    pred = extract_boxed(solution_str)
    acc = pred is not None and math_answers_equal(pred, str(ground_truth))
    formatted = FORMAT.fullmatch(solution_str) is not None
    return {"score": (1.0 - format_score) * float(acc) + format_score * float(formatted),
            "acc": acc, "pred": pred}
