"""Number extraction and normalisation shared by the gsm8k and arithmetic scorers.

One mechanism for every "is this number the answer" question: find number-like
spans, turn each into a canonical string (``"1,000.50"`` -> ``"1000.5"``,
``"18.0"`` -> ``"18"``, ``"−5"`` -> ``"-5"``) and compare canonical values.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, InvalidOperation

# Minus signs that models and datasets emit: ASCII hyphen, unicode minus, en dash.
_MINUS_SIGNS = "-\u2212\u2013"

NUMBER_RE = re.compile(
    # A sign directly after a digit or ')' is a binary minus ("10-3"), not a sign.
    rf"(?<![\d)])(?P<sign>[{_MINUS_SIGNS}])?"
    r"(?:\$\s?)?"  # currency: "$18", "-$5", "$ 18"
    # Thousands groups only when well formed ("1,000" yes, "1,2,3" is a list).
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?![\d])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)


def canonical_number(sign: str | None, digits: str) -> str | None:
    """Canonical decimal string for a matched number, or None if it is not a number."""
    try:
        value = Decimal(digits.replace(",", ""))
    except InvalidOperation:
        return None
    if value == 0:
        return "0"  # no "-0"
    if sign:
        value = -value
    # Enough precision that normalize() never rounds a long number (default is 28 digits).
    return format(value.normalize(Context(prec=len(digits) + 2)), "f")


def find_numbers(text: str) -> list[str]:
    """All numbers in ``text`` as canonical strings, in order of appearance."""
    found = (canonical_number(m["sign"], m["digits"]) for m in NUMBER_RE.finditer(text))
    return [number for number in found if number is not None]


def first_number(text: str) -> str | None:
    """The first number in ``text`` (canonical), or None."""
    numbers = find_numbers(text)
    return numbers[0] if numbers else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (canonical), or None."""
    numbers = find_numbers(text)
    return numbers[-1] if numbers else None


def parse_number(value: object) -> str | None:
    """Canonical form of a ground truth that is a single number (``72``, ``"1,000"``, ``"-5."``).

    Returns None when ``value`` is not exactly one number (then callers fall back to
    comparing stripped strings).
    """
    if isinstance(value, bool):
        return None
    text = str(value).strip().rstrip(".")
    match = NUMBER_RE.fullmatch(text)
    return canonical_number(match["sign"], match["digits"]) if match else None


def answers_match(pred: str, ground_truth: object) -> bool:
    """True when ``pred`` equals ``ground_truth`` as numbers (or as stripped strings)."""
    expected = parse_number(ground_truth)
    if expected is None:
        return pred.strip() == str(ground_truth).strip()
    return parse_number(pred) == expected
