"""Number extraction and normalisation shared by the gsm8k and arithmetic scorers.

One mechanism for every "is this number the answer" question: find number-like
spans, turn each into a canonical string (``"1,000.50"`` -> ``"1000.5"``,
``"18.0"`` -> ``"18"``, ``"−5"`` -> ``"-5"``) and compare canonical values.

A final answer (the text after GSM8K's ``####``, a ground truth) may also be written
with spaces as thousands separators (``"1 000 000"``) or as a fraction (``"3/4"`` ->
``"0.75"``; ``"2/6"`` -> ``"1/3"``, which has no finite decimal): `first_answer_number`,
`parse_answer_number`.  Free text is not read that way (`find_numbers`): there
``"2 100"`` is two numbers and ``"3/4"`` may be a division still to do.
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, InvalidOperation
from fractions import Fraction

# Minus signs that models and datasets emit: ASCII hyphen, unicode minus, en dash.
_MINUS_SIGNS = "-\u2212\u2013"

NUMBER_RE = re.compile(
    # A sign directly after a digit or ')' is a binary minus ("10-3"), not a sign.
    rf"(?<![\d)])(?P<sign>[{_MINUS_SIGNS}])?"
    r"(?:\$\s?)?"  # currency: "$18", "-$5", "$ 18"
    # Thousands groups only when well formed ("1,000" yes, "1,2,3" is a list).
    r"(?P<digits>\d{1,3}(?:,\d{3})+(?![\d])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)"
)


# Spaces that write thousands groups: ASCII, no-break, thin and narrow no-break.
_GROUP_SPACES = " \u00a0\u2009\u202f"
ANSWER_NUMBER_RE = re.compile(
    rf"(?<![\d)])(?P<sign>[{_MINUS_SIGNS}])?"
    r"(?:\$\s?)?"
    # A fraction of two integers, not a date ("3/4/2020").
    r"(?:(?P<numerator>\d+) ?/ ?(?P<denominator>\d+)(?![/\d])"
    # Thousands groups split by one kind of space, each group of three digits.
    rf"|(?P<spaced>\d{{1,3}}(?P<space>[{_GROUP_SPACES}])\d{{3}}(?:(?P=space)\d{{3}})*(?!\d)"
    r"(?:\.\d+)?)"
    r"|(?P<digits>\d{1,3}(?:,\d{3})+(?![\d])(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+))"
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


def _canonical_answer(match: re.Match) -> str | None:
    """Canonical string of an `ANSWER_NUMBER_RE` match: a fraction with a finite decimal
    as that decimal, any other as ``p/q`` in lowest terms; None for a zero denominator."""
    if match["denominator"] is None:
        digits = match["digits"] or "".join(
            char for char in match["spaced"] if char not in _GROUP_SPACES)
        return canonical_number(match["sign"], digits)
    if int(match["denominator"]) == 0:
        return None
    value = Fraction(int(match["numerator"]), int(match["denominator"]))
    if value == 0:
        return "0"
    sign = "-" if match["sign"] else ""
    rest, twos, fives = value.denominator, 0, 0
    while rest % 2 == 0:
        rest, twos = rest // 2, twos + 1
    while rest % 5 == 0:
        rest, fives = rest // 5, fives + 1
    if rest != 1:  # no finite decimal (1/3)
        return f"{sign}{value.numerator}/{value.denominator}"
    # p / (2^a 5^b) = p 2^(k-a) 5^(k-b) / 10^k, k = max(a, b): exact, whatever its length.
    places = max(twos, fives)
    scaled = value.numerator * 2 ** (places - twos) * 5 ** (places - fives)
    return canonical_number(sign, f"{scaled}E-{places}")


def first_answer_number(text: str) -> str | None:
    """The first number of a final answer in ``text`` (canonical; module docstring: also
    ``1 000`` and ``3/4``), or None."""
    for match in ANSWER_NUMBER_RE.finditer(text):
        number = _canonical_answer(match)
        if number is not None:
            return number
    return None


def parse_answer_number(value: object) -> str | None:
    """Canonical form of a final answer that is a single number (`parse_number`'s, and
    ``"1 000 000"`` and ``"3/4"``), or None."""
    if isinstance(value, bool):
        return None
    match = ANSWER_NUMBER_RE.fullmatch(str(value).strip().rstrip("."))
    return _canonical_answer(match) if match else None


def answers_match(pred: str, ground_truth: object) -> bool:
    """True when ``pred`` equals ``ground_truth`` as numbers (`parse_answer_number`: also
    ``1 000`` and ``3/4``), or as stripped strings where the ground truth is no number."""
    expected = parse_answer_number(ground_truth)
    if expected is None:
        return pred.strip() == str(ground_truth).strip()
    return parse_answer_number(pred) == expected
