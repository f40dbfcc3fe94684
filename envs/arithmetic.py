"""Arithmetic problems generated from a seed: ``3+4=`` -> ``7``.

``prompt_style="plain"`` renders exactly ``3+4=``: only characters of
:data:`ARITHMETIC_ALPHABET`, for the character-level demo model.
``prompt_style="chat"`` renders a user message for instruct models.
Problem ``i`` depends only on ``(seed, i)``: ``make_arithmetic_records(5, s)`` is
a prefix of ``make_arithmetic_records(10, s)``.

``heldout_fraction`` sets that share of all problems aside (by a hash of the
expression, so the same ones for every seed): ``split="train"`` never draws them,
``split="heldout"`` draws only them, so an evaluation on the held-out split scores
problems training never saw.
"""

from __future__ import annotations

import random
import zlib
from typing import Any

from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.rewards._expr import evaluate_expression

ARITHMETIC_ALPHABET = "0123456789+-*="
ARITHMETIC_OPS = "+-*"
PROMPT_STYLES = ("plain", "chat")
SPLITS = ("train", "heldout")
_MAX_DRAWS = 10_000  # per problem: a split that (nearly) never matches fails loudly
DATA_SOURCE = "arithmetic"


def make_arithmetic_records(
    n: int,
    seed: int = 0,
    *,
    max_operand: int = 9,
    ops: str = "+",
    num_terms: int = 2,
    allow_negative: bool = False,
    prompt_style: str = "plain",
    heldout_fraction: float = 0.0,
    split: str = "train",
) -> list[PromptRecord]:
    """``n`` problems; ground truth is the integer answer, ``extra_info`` has
    ``expression`` (``"3+4"``) and ``answer`` (``"7"``).

    Operands are drawn from ``[0, max_operand]`` (``[-max_operand, max_operand]``
    with ``allow_negative``); without ``allow_negative`` problems with a negative
    answer are redrawn. ``ops`` is a string of operators from ``"+-*"``
    (standard precedence).  ``heldout_fraction`` and ``split``: see the module docstring.
    """
    _check_knobs(max_operand, ops, num_terms, prompt_style)
    _check_split(heldout_fraction, split)
    return [
        _make_record(index, seed, max_operand, ops, num_terms, allow_negative, prompt_style,
                     heldout_fraction, split)
        for index in range(n)
    ]


def _check_split(heldout_fraction: float, split: str) -> None:
    if not 0.0 <= heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {heldout_fraction}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if split == "heldout" and heldout_fraction == 0.0:
        raise ValueError("split='heldout' needs heldout_fraction > 0 (the share of problems "
                         "set aside), e.g. heldout_fraction=0.2")


def is_heldout(expression: str, heldout_fraction: float) -> bool:
    """Whether ``expression`` is in the held-out share (a stable hash, the same in every
    process and for every seed)."""
    return zlib.crc32(expression.encode()) % 10_000 < heldout_fraction * 10_000


def _check_knobs(max_operand: int, ops: str, num_terms: int, prompt_style: str) -> None:
    if max_operand < 0:
        raise ValueError(f"max_operand must be >= 0, got {max_operand}")
    if not ops or set(ops) - set(ARITHMETIC_OPS):
        raise ValueError(f"ops must be a non-empty string of {ARITHMETIC_OPS!r}, got {ops!r}")
    if num_terms < 2:
        raise ValueError(f"num_terms must be >= 2, got {num_terms}")
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")


def _make_record(
    index: int,
    seed: int,
    max_operand: int,
    ops: str,
    num_terms: int,
    allow_negative: bool,
    prompt_style: str,
    heldout_fraction: float = 0.0,
    split: str = "train",
) -> PromptRecord:
    rng = random.Random(f"arithmetic:{seed}:{index}")  # str seeds are stable across runs
    low = -max_operand if allow_negative else 0
    for _ in range(_MAX_DRAWS):
        operands = [rng.randint(low, max_operand) for _ in range(num_terms)]
        operators = [rng.choice(ops) for _ in range(num_terms - 1)]
        expression = _join(operands, operators, negative_in_parens=False, spaced=False)
        if heldout_fraction and is_heldout(expression, heldout_fraction) != (
                split == "heldout"):
            continue
        value, _ = evaluate_expression(expression, allow_unary_minus=True)
        if allow_negative or value >= 0:
            break
    else:
        raise ValueError(
            f"no {split!r} problem in {_MAX_DRAWS} draws: with max_operand={max_operand}, "
            f"ops={ops!r} and heldout_fraction={heldout_fraction} the split is (nearly) "
            "empty; raise max_operand or change heldout_fraction")
    if prompt_style == "plain":
        prompt: Any = expression + "="
    else:
        shown = _join(operands, operators, negative_in_parens=True, spaced=True)
        prompt = [{"role": "user", "content": f"What is {shown}? Answer with a number."}]
    answer = int(value)
    return PromptRecord(
        prompt=prompt,
        ground_truth=answer,
        data_source=DATA_SOURCE,
        extra_info={
            "expression": expression,
            "answer": str(answer),
            "seed": seed,
            "problem": index,
        },
    )


def _join(
    operands: list[int], operators: list[str], *, negative_in_parens: bool, spaced: bool
) -> str:
    """``3+-4`` (plain alphabet) or ``3 + (-4)`` (chat)."""
    terms = [f"({n})" if negative_in_parens and n < 0 else str(n) for n in operands]
    glue = " {} " if spaced else "{}"
    parts = [terms[0]]
    for operator, term in zip(operators, terms[1:], strict=True):
        parts.append(glue.format(operator) + term)
    return "".join(parts)


def problem_seed(seed: int | None, data_seed: int | None) -> int:
    """The seed generated problems come from: ``data_seed``, else ``seed``, else 0."""
    if data_seed is not None:
        return data_seed
    return seed if seed is not None else 0


class ArithmeticEnv(TextEnv):
    """Generated arithmetic problems (``data_source="arithmetic"``).

    ``seed`` fixes the shuffled order (None: random) and, unless ``data_seed``
    is given, the problems too (None: the problems of seed 0).  ``heldout_fraction``
    and ``split`` keep a share of the problems for evaluation (module docstring).  Other
    keyword arguments go to :class:`~rllib_grpo.envs.text.TextEnv`.
    """

    def __init__(
        self,
        *,
        num_problems: int = 10_000,
        max_operand: int = 9,
        ops: str = "+",
        num_terms: int = 2,
        allow_negative: bool = False,
        prompt_style: str = "plain",
        heldout_fraction: float = 0.0,
        split: str = "train",
        seed: int | None = None,
        data_seed: int | None = None,
        **env_kwargs: Any,
    ) -> None:
        records = make_arithmetic_records(
            num_problems,
            problem_seed(seed, data_seed),
            max_operand=max_operand,
            ops=ops,
            num_terms=num_terms,
            allow_negative=allow_negative,
            prompt_style=prompt_style,
            heldout_fraction=heldout_fraction,
            split=split,
        )
        super().__init__(PromptDataset(records, name="arithmetic"), seed=seed, **env_kwargs)
