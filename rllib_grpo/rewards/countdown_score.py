"""Countdown scorer: an equation over the given numbers that evaluates to the target.

Rules (TinyZero's): every given number is used **exactly once** (the multiset of
integer literals equals ``numbers``); only ``+ - * /`` and parentheses; division
is exact. ``use_all_numbers=False`` relaxes this to "each number at most once".
The equation is taken from the last ``<answer>...</answer>``, else from the last
non-empty line; a trailing ``= target`` is ignored. Evaluation goes through
:func:`rllib_grpo.rewards._expr.evaluate_expression` (ast walk, never ``eval``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from rllib_grpo.rewards._expr import evaluate_expression
from rllib_grpo.rewards.pool import declare_isolation

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
# Symbols models write for the four operations.
_OPERATOR_SPELLINGS = str.maketrans({"×": "*", "x": "*", "÷": "/", "−": "-", "–": "-"})


def parse_countdown_ground_truth(ground_truth: Any) -> tuple[int, list[int]]:
    """``(target, numbers)`` from ``{"target": int, "numbers": [...]}`` (or its JSON string)."""
    if isinstance(ground_truth, str):
        ground_truth = json.loads(ground_truth)
    return int(ground_truth["target"]), [int(n) for n in ground_truth["numbers"]]


def extract_countdown_equation(text: str) -> str | None:
    """The equation the response commits to (without a trailing ``= result``), or None."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        candidate = tagged[-1]
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return None
        candidate = lines[-1]
    equation = candidate.split("=")[0].translate(_OPERATOR_SPELLINGS).strip()
    return equation or None


@declare_isolation("thread")  # parses expressions: on a thread with a deadline
def score_countdown(solution_str: str, ground_truth: Any, *, use_all_numbers: bool = True) -> dict:
    """Score 1.0 when the equation uses the allowed numbers and evaluates to the target.

    ``pred`` is None when no parseable equation was found (a format failure), so
    a scorer ``format_score`` rewards only well-formed but wrong equations.
    """
    target, numbers = parse_countdown_ground_truth(ground_truth)
    equation = extract_countdown_equation(solution_str)
    if equation is None:
        return {"score": 0.0, "acc": False, "pred": None}
    try:
        value, used = evaluate_expression(equation)
    except ValueError:
        return {"score": 0.0, "acc": False, "pred": None}
    acc = value == target and _numbers_allowed(used, numbers, use_all_numbers)
    return {"score": float(acc), "acc": acc, "pred": equation}


def _numbers_allowed(used: list[int], given: list[int], use_all_numbers: bool) -> bool:
    if use_all_numbers:
        return Counter(used) == Counter(given)
    return not Counter(used) - Counter(given)  # nothing used more often than given
