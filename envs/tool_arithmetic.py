"""``rllib_grpo/ToolArithmetic-v0``: multi-step arithmetic where the calculator pays.

Problems such as ``47*86+19`` (``num_terms`` operands in ``[min_operand,
max_operand]``, operators from ``ops``) are beyond what a small model computes
in its head, but the answer is one tool call away::

    47*86+19=                                   (prompt, plain style)
    <tool>calculator: 47*86+19</tool>           (model turn 1)
    <result>4061</result>                       (environment)
    4061                                        (model turn 2: the final answer)

A turn without a tool call is the final answer: the last number in it is
scored against the ground truth (1 right, 0 wrong) and the episode ends.  At
most ``max_turns`` model turns; unanswered episodes are truncated with reward 0.

``prompt_style="plain"`` renders ``47*86+19=`` (for the character-level
``builtin:demo-tools`` model); ``"chat"`` a user message that explains the
tool protocol, for instruct models with a chat template.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_grpo.envs.arithmetic import PROMPT_STYLES, problem_seed
from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.multiturn import MultiTurnTextEnv
from rllib_grpo.envs.tools import Tool
from rllib_grpo.rewards._expr import evaluate_expression

DATA_SOURCE = "arithmetic"  # scored by the arithmetic reward: the last number of the answer
CHAT_INSTRUCTION = (
    "What is {expression}? You may use a calculator by writing "
    "<tool>calculator: EXPRESSION</tool>; its result comes back as <result>VALUE</result>. "
    "When you know the answer, reply with the number only."
)


def make_tool_arithmetic_records(
    n: int, seed: int = 0, *, min_operand: int = 10, max_operand: int = 99, ops: str = "+*",
    num_terms: int = 3, prompt_style: str = "plain",
) -> list[PromptRecord]:
    """``n`` problems; problem ``i`` depends only on ``(seed, i)``.

    Ground truth is the integer value; ``extra_info`` has ``expression`` and ``answer``.
    """
    if not 0 <= min_operand <= max_operand:
        raise ValueError(f"need 0 <= min_operand <= max_operand, got {min_operand}, "
                         f"{max_operand}")
    if not ops or set(ops) - set("+-*"):
        raise ValueError(f"ops must be a non-empty string of '+-*', got {ops!r}")
    if num_terms < 2:
        raise ValueError(f"num_terms must be >= 2, got {num_terms}")
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    records = []
    for index in range(n):
        rng = random.Random(f"tool_arithmetic:{seed}:{index}")
        while True:
            operands = [rng.randint(min_operand, max_operand) for _ in range(num_terms)]
            operators = [rng.choice(ops) for _ in range(num_terms - 1)]
            expression = str(operands[0]) + "".join(
                op + str(x) for op, x in zip(operators, operands[1:], strict=True))
            value, _ = evaluate_expression(expression)
            if value >= 0:
                break
        prompt: Any = (expression + "=" if prompt_style == "plain" else
                       [{"role": "user", "content": CHAT_INSTRUCTION.format(
                           expression=expression)}])
        records.append(PromptRecord(prompt=prompt, ground_truth=int(value),
                                    data_source=DATA_SOURCE,
                                    extra_info={"expression": expression,
                                                "answer": str(int(value)), "problem": index}))
    return records


class ToolArithmeticEnv(MultiTurnTextEnv):
    """Generated multi-step arithmetic with a ``calculator`` tool (see the module docstring).

    ``seed`` fixes the order (and, without ``data_seed``, the problems). Other keyword
    arguments go to `MultiTurnTextEnv` / `TextEnv`.
    """

    def __init__(self, *, num_problems: int = 10_000, min_operand: int = 10,
                 max_operand: int = 99, ops: str = "+*", num_terms: int = 3,
                 prompt_style: str = "plain", max_turns: int = 3,
                 tools: Sequence[str | Tool] | Mapping[str, Mapping] | None = ("calculator",),
                 seed: int | None = None, data_seed: int | None = None,
                 **env_kwargs: Any) -> None:
        records = make_tool_arithmetic_records(
            num_problems, problem_seed(seed, data_seed), min_operand=min_operand,
            max_operand=max_operand, ops=ops, num_terms=num_terms, prompt_style=prompt_style)
        super().__init__(PromptDataset(records, name="tool_arithmetic"), max_turns=max_turns,
                         tools=tools, seed=seed, **env_kwargs)
