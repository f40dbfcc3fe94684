"""Safe evaluation of small arithmetic expressions (countdown answers, generated problems).

Parses with :mod:`ast` and walks only integer literals, ``+ - * /`` and
parentheses (optionally unary minus). Never calls ``eval``. Division is exact
(:class:`fractions.Fraction`), so ``7/2*2`` is 7, not 7.000000001.
"""

from __future__ import annotations

import ast
import operator
from fractions import Fraction

# Long inputs are rejected before parsing: deeply nested parentheses make
# ast.parse itself recurse and can blow the stack.
MAX_EXPRESSION_CHARS = 200

_BINARY_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}


def evaluate_expression(
    text: str, *, allow_unary_minus: bool = False
) -> tuple[Fraction, list[int]]:
    """Evaluate ``text`` exactly; return ``(value, integer literals used, in order)``.

    Raises:
        ValueError: for anything but integer literals, ``+ - * /``, parentheses
            (and unary minus when allowed), for division by zero and for
            expressions longer than ``MAX_EXPRESSION_CHARS``.
    """
    if len(text) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as err:
        raise ValueError(f"not an arithmetic expression: {text!r}") from err
    literals: list[int] = []
    value = _evaluate_node(tree.body, literals, allow_unary_minus)
    return value, literals


def _evaluate_node(node: ast.AST, literals: list[int], allow_unary_minus: bool) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:  # not bool, not float
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
        left = _evaluate_node(node.left, literals, allow_unary_minus)
        right = _evaluate_node(node.right, literals, allow_unary_minus)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _BINARY_OPS[type(node.op)](left, right)
    if allow_unary_minus and isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate_node(node.operand, literals, allow_unary_minus)
    raise ValueError(f"unsupported syntax: {ast.dump(node)[:60]}")
