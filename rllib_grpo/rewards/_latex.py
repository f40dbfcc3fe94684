"""LaTeX helpers for the MATH scorer: brace matching and sympy comparison.

For comparison the LaTeX is rewritten token by token into sympy syntax
(``\\frac{a}{b}`` -> ``((a)/(b))``, ``\\sqrt{x}`` -> ``sqrt(x)``, ``^`` -> ``**``,
braces -> parentheses); sympy's own ``parse_expr`` does the parsing. Because
``parse_expr`` evaluates Python, the rewritten text must pass a whitelist first:
digits, operators, parentheses, commas, single-letter symbols and
``sqrt``/``pi``/``oo`` only. Huge exponents (``9^{9^{9}}``) are refused before
evaluation. Anything else is "not comparable", and the caller's string
comparison decides.
"""

from __future__ import annotations

import re
import string

MAX_SYMPY_CHARS = 200
MAX_EXPONENT = 1000
_RELATIVE_TOLERANCE = 1e-9

_SIMPLE_REPLACEMENTS = {
    "\\pi": "pi",
    "\\infty": "oo",
    "\\cdot": "*",
    "\\times": "*",
    "\\div": "/",
    "^": "**",
    "{": "(",
    "}": ")",
}
_ALLOWED_CHARS = re.compile(r"[0-9A-Za-z+\-*/().,\s]*")
_ALLOWED_NAMES = {"sqrt", "pi", "oo"}
_NON_DECIMAL_DOT = re.compile(r"(?<!\d)\.|\.(?!\d)")  # "a.b" would be attribute access
_THOUSANDS = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d,])")


def matching_brace(text: str, open_index: int) -> int | None:
    """Index of the ``}`` closing the ``{`` at ``open_index``, or None if unbalanced."""
    depth = 0
    for index in range(open_index, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return index
    return None


def sympy_equal(left: str, right: str) -> bool:
    """True when both normalised answers parse and are equal symbolically or numerically."""
    left_expr, right_expr = _parse(left), _parse(right)
    if left_expr is None or right_expr is None:
        return False
    return _expressions_equal(left_expr, right_expr)


def latex_to_sympy_syntax(latex: str) -> str | None:
    """Sympy-parsable text for a normalised LaTeX answer, or None if unsupported."""
    text = _rewrite_commands(latex)
    if text is None:
        return None
    for token, replacement in _SIMPLE_REPLACEMENTS.items():
        text = text.replace(token, replacement)
    text = _THOUSANDS.sub(lambda m: m[0].replace(",", ""), text)  # "1,000" is not a tuple
    if "\\" in text or len(text) > MAX_SYMPY_CHARS or not _ALLOWED_CHARS.fullmatch(text):
        return None
    if _NON_DECIMAL_DOT.search(text):
        return None
    names = set(re.findall(r"[A-Za-z]+", text))
    if any(len(name) > 1 and name not in _ALLOWED_NAMES for name in names):
        return None
    return text


def _rewrite_commands(latex: str) -> str | None:
    """Rewrite ``\\frac{a}{b}``, ``\\sqrt{x}``, ``\\sqrt[n]{x}`` recursively; None if malformed."""
    match = re.search(r"\\frac\{|\\sqrt\[|\\sqrt\{", latex)
    if match is None:
        return latex
    head, command, tail = latex[: match.start()], match[0], latex[match.end() - 1 :]
    root = None
    if command == "\\sqrt[":
        close_root = tail.find("]")
        if close_root < 0:
            return None
        root, tail = _rewrite_commands(tail[1:close_root]), tail[close_root + 1 :]
    args = []
    for _ in range(2 if command == "\\frac{" else 1):
        close = matching_brace(tail, 0) if tail.startswith("{") else None
        if close is None:
            return None
        args.append(_rewrite_commands(tail[1:close]))
        tail = tail[close + 1 :]
    rest = _rewrite_commands(tail)
    if None in args or rest is None or (command == "\\sqrt[" and root is None):
        return None
    if command == "\\frac{":
        rewritten = f"(({args[0]})/({args[1]}))"
    elif command == "\\sqrt{":
        rewritten = f"sqrt({args[0]})"
    else:
        rewritten = f"(({args[0]})**(1/({root})))"
    return head + rewritten + rest


def _parse(latex: str):
    """A sympy expression (or tuple) for ``latex``, or None when unsupported."""
    text = latex_to_sympy_syntax(latex)
    if text is None:
        return None
    from sympy import Symbol
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    # Every letter is a plain symbol: "E", "I", "N", "S" must not become sympy's
    # constants and functions.
    symbols = {letter: Symbol(letter) for letter in string.ascii_letters}
    transformations = (*standard_transformations, implicit_multiplication_application)
    try:
        unevaluated = parse_expr(
            text, local_dict=dict(symbols), transformations=transformations, evaluate=False
        )
        if not _powers_are_small(unevaluated):
            return None
        return parse_expr(text, local_dict=dict(symbols), transformations=transformations)
    except Exception:  # noqa: BLE001 - any parse failure means "not comparable"
        return None


def _powers_are_small(expr) -> bool:
    """Refuse huge numeric exponents, whose evaluation would hang (``9^{9^{9}}``)."""
    from sympy import Basic, Pow

    parts = expr if isinstance(expr, tuple) else (expr,)
    for part in parts:
        if not isinstance(part, Basic):
            return False
        for power in part.atoms(Pow):
            # evalf is floating point, so sizing even a tower is cheap.
            if power.exp.is_number and not abs(power.exp.evalf(15)) <= MAX_EXPONENT:
                return False
    return True


def _expressions_equal(left, right) -> bool:
    from sympy import Tuple, nsimplify, simplify

    sequence = tuple | Tuple
    if isinstance(left, sequence) or isinstance(right, sequence):
        return (
            isinstance(left, sequence)
            and isinstance(right, sequence)
            and len(left) == len(right)
            and all(_expressions_equal(a, b) for a, b in zip(left, right, strict=True))
        )
    try:
        if left.is_number and right.is_number:
            return _numbers_close(complex(left), complex(right))
        return simplify(nsimplify(left) - nsimplify(right)) == 0
    except Exception:  # noqa: BLE001 - e.g. a relational or an unsupported object
        return False


def _numbers_close(left: complex, right: complex) -> bool:
    return abs(left - right) <= _RELATIVE_TOLERANCE * max(1.0, abs(right))
