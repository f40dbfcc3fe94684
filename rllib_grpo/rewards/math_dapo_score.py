"""DAPO's math scorer (verl ``math_dapo``): +1 for a right answer, -1 for a wrong one.

verl scores ``data_source`` ``math_dapo``, ``math_dapo_reasoning`` and every ``aime*``
with it (DAPO-Math-17k, AIME).  As verl ``utils/reward_score/math_dapo.py``:

1. only the last 300 characters of the response are read;
2. the answer is the last Minerva ``Answer: ...`` (to the end of its line; of several on
   one line the last counts), normalised with ``normalize_final_answer`` (Minerva's
   rules: text units dropped, ``\\frac12`` braced, ...) and compared to the normalised
   ground truth as strings;
3. without an ``Answer:`` the last ``\\boxed{...}`` of the last 100 characters is taken,
   compared verbatim (verl [NEW]'s fallback; [JAN] scored a box-only answer -1).

Returns ``{"score": +-1.0, "acc": bool, "pred": str | None}``; ``pred`` is None where
verl writes ``"[INVALID]"`` (nothing found), this package's convention for "unparsed".
"""

from __future__ import annotations

import re
from typing import Any

from rllib_grpo.rewards._latex import matching_brace
from rllib_grpo.rewards.pool import declare_isolation

RESPONSE_TAIL_CHARS = 300
BOX_TAIL_CHARS = 100
_ANSWER = re.compile(r"(?i)answer\s*:\s*((?:(?!answer\s*:)[^\n])+)")

_SUBSTITUTIONS = (
    ("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""),
    ("mbox", "text"), (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"),
)
_REMOVED_EXPRESSIONS = (
    "square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units",
    "\\ldots", "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm",
    "pounds", "meters", "meals", "edges", "students", "childrentickets", "multiples",
    "\\text{s}", "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}",
    "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots",
)


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's normalisation of a final answer (verl ``normalize_final_answer``)."""
    text = final_answer.split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        text = text.replace(before, after)
    for expression in _REMOVED_EXPRESSIONS:
        text = text.replace(expression, "")
    text = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", text)
    text = re.sub(r"(\\text\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\textbf\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\overline\{)(.*?)(\})", "\\2", text)
    text = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", text)
    text = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", text)
    text = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", text)
    text = text.replace("$", "")
    if text.replace(",", "").isdigit():
        text = text.replace(",", "")
    return text.strip()


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (verl ``last_boxed_only_string`` + ``remove_boxed``)."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    close = matching_brace(text, start + len("\\boxed"))
    return text[start + len("\\boxed{"):close] if close is not None else None


@declare_isolation("thread")  # parses expressions: on a thread with a deadline
def score_math_dapo(solution_str: str, ground_truth: Any) -> dict:
    """+1/-1 for the last ``Answer:`` (else the last box) against ``ground_truth``."""
    tail = solution_str[-RESPONSE_TAIL_CHARS:]
    truth = str(ground_truth)
    answers = _ANSWER.findall(tail)
    pred: str | None
    if answers:
        pred = normalize_final_answer(answers[-1])
        correct = pred == normalize_final_answer(truth)
    else:
        pred = _last_boxed(tail[-BOX_TAIL_CHARS:])
        correct = pred is not None and pred == truth
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
