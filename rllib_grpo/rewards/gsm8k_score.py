"""GSM8K scorer: the answer after ``####`` (strict) or the last number (flexible).

Fixes over verl's ``gsm8k.compute_score`` (docs/grpo-semantics.md section 6.3):

* numbers compare by value, not string: ``#### 18.0`` vs ``18``, ``#### 1,000``
  and ``#### 1 000`` vs ``1000``, ``#### 3/4`` vs ``0.75``, unicode minus ``−5`` vs ``-5``;
* ``#### $18`` and ``#### $ 18`` parse (the currency sign is skipped);
* a trailing period is not part of the number (``The answer is 18.``);
* the whole response is searched (a window is the scorer's optional
  ``max_answer_chars``), so text after a correct ``#### 18`` does not zero it;
* flexible mode prefers a ``####`` answer and falls back to the last number.
"""

from __future__ import annotations

import re
from typing import Any

from rllib_grpo.rewards._numbers import answers_match, first_answer_number, last_number
from rllib_grpo.rewards.pool import declare_isolation

GSM8K_METHODS = ("strict", "flexible")

# The text after a marker runs to the end of its line or to the next marker, so that of
# several markers on one line the last one counts ("#### 5 #### 7" answers 7).
_ANSWER_MARKER = re.compile(r"####\s*(?P<rest>(?:(?!####)[^\n])*)")


def extract_gsm8k_answer(text: str, method: str = "strict") -> str | None:
    """The canonical number the response gives as its answer, or None.

    ``strict``: the first number after the last ``####`` that has one (a fraction and
    space-separated thousands count as one number there: `first_answer_number`).
    ``flexible``: as strict, else the last number anywhere in ``text``.
    """
    if method not in GSM8K_METHODS:
        raise ValueError(f"gsm8k method must be one of {GSM8K_METHODS}, got {method!r}")
    for marker in reversed(list(_ANSWER_MARKER.finditer(text))):
        number = first_answer_number(marker["rest"])
        if number is not None:
            return number
    return last_number(text) if method == "flexible" else None


@declare_isolation("inline")  # time linear in the response: runs inline
def score_gsm8k(solution_str: str, ground_truth: Any, *, method: str = "strict") -> dict:
    """Score 1.0 when the extracted answer equals ``ground_truth`` as a number, else 0.0.

    ``ground_truth`` may also be a full GSM8K solution ending in ``#### 72``.
    """
    truth = extract_gsm8k_answer(str(ground_truth)) or ground_truth
    pred = extract_gsm8k_answer(solution_str, method)
    acc = pred is not None and answers_match(pred, truth)
    return {"score": float(acc), "acc": acc, "pred": pred}
