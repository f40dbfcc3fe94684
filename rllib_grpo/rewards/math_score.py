"""MATH scorer: the last ``\\boxed{}`` answer, compared after normalisation and with sympy.

Pipeline (one pass for prediction and ground truth alike):

1. extract: the last ``\\boxed{...}`` / ``\\fbox{...}`` with brace matching (nested
   braces work), ``\\boxed 5`` (space form), else a Minerva ``Answer: ...`` line
   (math_dapo style);
2. normalise: Hendrycks-style ``strip_string`` (:func:`normalize_math_answer`);
   equal strings are equal answers;
3. otherwise convert both normalised strings to sympy syntax (a token rewrite:
   ``\\frac{a}{b}`` -> ``((a)/(b))``, ``^`` -> ``**``; sympy does the parsing) and
   compare symbolically / numerically (:mod:`rllib_grpo.rewards._latex`).
"""

from __future__ import annotations

import re
from typing import Any

from rllib_grpo.rewards._latex import matching_brace, sympy_equal
from rllib_grpo.rewards._numbers import parse_number
from rllib_grpo.rewards.pool import declare_isolation

_BOX_COMMANDS = ("\\boxed", "\\fbox")
# An answer runs to the end of its line or to the next "Answer:" on it: the last one counts.
_MINERVA_ANSWER = re.compile(r"(?i)answer\s*:\s*((?:(?!answer\s*:)[^\n])+)")
_DELETED_TOKENS = (
    "\\left",
    "\\right",
    "\\displaystyle",
    "\\!",
    "\\,",
    "\\;",
    "\\:",
    "\\ ",
    "~",
    "^{\\circ}",
    "^\\circ",
    "°",
    "\\$",
    "$",
    "\\%",
    "%",
)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``/``\\fbox{...}`` (or ``\\boxed 5``), or None."""
    start = max(text.rfind(command) for command in _BOX_COMMANDS)
    if start < 0:
        return None
    after = text[start:].removeprefix("\\boxed").removeprefix("\\fbox")
    if after.startswith(" "):  # "\boxed 5$": up to the closing dollar
        return after[1:].split("$")[0].strip() or None
    if not after.startswith("{"):
        return None
    close = matching_brace(after, 0)
    return (after[1:close].strip() or None) if close is not None else None


def extract_math_answer(text: str) -> str | None:
    """The boxed answer, else the last ``Answer: ...`` line (trailing ``$``/``.`` dropped)."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    answers = _MINERVA_ANSWER.findall(text)
    if not answers:
        return None
    return answers[-1].strip().lstrip("$").rstrip(" $.") or None


def normalize_math_answer(answer: str) -> str:
    """Hendrycks-style ``strip_string``: a canonical string for comparing answers."""
    text = _drop_text_units(answer.replace("\n", "").replace("{,}", ","))
    text = text.replace("\\tfrac", "\\frac").replace("\\dfrac", "\\frac")
    for token in _DELETED_TOKENS:
        text = text.replace(token, "")
    text = re.sub(r"\s+", "", text).rstrip(".")
    text = _drop_short_lhs(text)
    text = _brace_single_char_args(text)
    text = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", text)  # ".5" -> "0.5"
    number = parse_number(text)  # "1,000" -> "1000", "18.0" -> "18"
    if number is not None:
        return number
    simple_fraction = re.fullmatch(r"(-?\d+)/(\d+)", text)
    if simple_fraction:
        numerator, denominator = simple_fraction.groups()
        return f"\\frac{{{numerator}}}{{{denominator}}}"
    return text


def math_answers_equal(pred: str, ground_truth: str) -> bool:
    """True when two answers are the same after normalisation or by sympy."""
    pred_norm = normalize_math_answer(pred)
    truth_norm = normalize_math_answer(ground_truth)
    if pred_norm == truth_norm:
        return True
    return sympy_equal(pred_norm, truth_norm)


@declare_isolation("thread")  # parses expressions: on a thread with a deadline
def score_math(solution_str: str, ground_truth: Any) -> dict:
    """Score 1.0 when the last boxed (or ``Answer:``) answer equals ``ground_truth``."""
    truth = str(ground_truth)
    truth = extract_boxed(truth) or truth  # tolerate a boxed ground truth
    pred = extract_math_answer(solution_str)
    acc = pred is not None and math_answers_equal(pred, truth)
    return {"score": float(acc), "acc": acc, "pred": pred}


def _drop_text_units(text: str) -> str:
    """``5\\text{ cm}`` -> ``5`` (units), but ``\\text{Monday}`` -> ``Monday``."""
    pieces: list[str] = []
    texts: list[str] = []
    rest = text
    while (found := _find_text_command(rest)) is not None:
        start, open_brace = found
        close = matching_brace(rest, open_brace)
        if close is None:
            break
        pieces.append(rest[:start])
        texts.append(rest[open_brace + 1 : close])
        rest = rest[close + 1 :]
    pieces.append(rest)
    without_text = "".join(pieces)
    if re.search(r"\d", without_text):
        return without_text
    return without_text + "".join(texts)


def _find_text_command(text: str) -> tuple[int, int] | None:
    match = re.search(r"\\(?:textbf|textrm|text|mathrm|mbox)\s*\{", text)
    return (match.start(), match.end() - 1) if match else None


def _drop_short_lhs(text: str) -> str:
    """``x=5`` -> ``5``: a left side of at most two characters is a variable name."""
    sides = text.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:
        return sides[1]
    return text


def _brace_single_char_args(text: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{2}``, ``\\sqrt3`` -> ``\\sqrt{3}``."""
    text = re.sub(r"\\sqrt([^{\[\\])", r"\\sqrt{\1}", text)
    # Two passes: each braces the first unbraced argument of every \frac.
    for _ in range(2):
        text = re.sub(r"\\frac((?:\{[^{}]*\})?)([^{\\])", r"\\frac\1{\2}", text)
    return text
