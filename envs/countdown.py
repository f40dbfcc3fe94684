"""Countdown problems generated from a seed: reach a target with the given numbers.

Each problem is built backwards from a random expression over the numbers, so
it is solvable by construction (``extra_info["solution"]``). Scoring is
:func:`rllib_grpo.rewards.countdown_score.score_countdown` (each number exactly once
by default; ``use_all_numbers=False`` allows using a subset).
"""

from __future__ import annotations

import operator
import random
from fractions import Fraction
from typing import Any

from rllib_grpo.envs.arithmetic import problem_seed
from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.text import TextEnv

DATA_SOURCE = "countdown"
_OPERATIONS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
PROMPT_TEMPLATE = (
    "Using the numbers {numbers}, create an equation that equals {target}. You can use "
    "basic arithmetic operations (+, -, *, /) and each number must be used exactly once. "
    "Show your work in <think> </think> tags, then give the final equation in "
    "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
)


def make_countdown_records(
    n: int, seed: int = 0, *, num_numbers: int = 3, max_number: int = 20, max_target: int = 100
) -> list[PromptRecord]:
    """``n`` problems with ground truth ``{"target": int, "numbers": [int, ...]}``.

    Numbers are drawn from ``[1, max_number]``; the target is an integer in
    ``[1, max_target]`` that a random expression over all numbers reaches.
    """
    if num_numbers < 2 or max_number < 1 or max_target < 1:
        raise ValueError("need num_numbers >= 2, max_number >= 1 and max_target >= 1")
    return [_make_record(index, seed, num_numbers, max_number, max_target) for index in range(n)]


def _make_record(
    index: int, seed: int, num_numbers: int, max_number: int, max_target: int
) -> PromptRecord:
    rng = random.Random(f"countdown:{seed}:{index}")
    while True:
        numbers = [rng.randint(1, max_number) for _ in range(num_numbers)]
        target, solution = _random_expression(rng, numbers)
        if target.denominator == 1 and 1 <= target <= max_target:
            break
    content = PROMPT_TEMPLATE.format(numbers=numbers, target=int(target))
    return PromptRecord(
        prompt=[{"role": "user", "content": content}],
        ground_truth={"target": int(target), "numbers": numbers},
        data_source=DATA_SOURCE,
        extra_info={"solution": solution, "seed": seed, "problem": index},
    )


def _random_expression(rng: random.Random, numbers: list[int]) -> tuple[Fraction, str]:
    """Combine random pairs until one expression is left; returns (value, text)."""
    pool = [(Fraction(n), str(n)) for n in numbers]
    while len(pool) > 1:
        rng.shuffle(pool)
        (left, left_text), (right, right_text) = pool.pop(), pool.pop()
        symbol = rng.choice("+-*/" if right != 0 else "+-*")
        value = _OPERATIONS[symbol](left, right)
        pool.append((value, f"({left_text} {symbol} {right_text})"))
    value, text = pool[0]
    return value, text[1:-1]  # drop the outermost parentheses


class CountdownEnv(TextEnv):
    """Generated countdown problems (``data_source="countdown"``), chat prompts.

    ``seed`` fixes the shuffled order (None: random) and, unless ``data_seed``
    is given, the problems too (None: the problems of seed 0). Other keyword
    arguments go to :class:`~rllib_grpo.envs.text.TextEnv`.
    """

    def __init__(
        self,
        *,
        num_problems: int = 10_000,
        num_numbers: int = 3,
        max_number: int = 20,
        max_target: int = 100,
        use_all_numbers: bool = True,
        seed: int | None = None,
        data_seed: int | None = None,
        **env_kwargs: Any,
    ) -> None:
        records = make_countdown_records(
            num_problems,
            problem_seed(seed, data_seed),
            num_numbers=num_numbers,
            max_number=max_number,
            max_target=max_target,
        )
        reward_kwargs = {"use_all_numbers": use_all_numbers, **env_kwargs.pop("reward_kwargs", {})}
        super().__init__(
            PromptDataset(records, name="countdown"),
            seed=seed,
            reward_kwargs=reward_kwargs,
            **env_kwargs,
        )
