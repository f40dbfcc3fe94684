"""Reward-function registry keyed like verl's ``data_source`` dispatch.

A *scorer* is ``fn(solution_str, ground_truth, **kwargs) -> float | dict``; the
registry maps names (and verl's dataset names as aliases) to scorers.
:func:`compute_score` is the verl ``default_compute_score`` contract:
``(data_source, solution_str, ground_truth, extra_info=None) -> float | dict``.
Every reward function the env uses (a :data:`RewardFn`) has that contract.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllib_grpo.rewards.arithmetic_score import score_arithmetic
from rllib_grpo.rewards.countdown_score import score_countdown
from rllib_grpo.rewards.geo3k_score import score_geo3k
from rllib_grpo.rewards.gsm8k_score import score_gsm8k
from rllib_grpo.rewards.math_dapo_score import score_math_dapo
from rllib_grpo.rewards.math_score import score_math
from rllib_grpo.rewards.pool import declare_isolation, declared_isolation

RewardFn = Callable[..., Any]
"""``(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float | dict``"""

_SCORERS: dict[str, Callable[..., Any]] = {}
_ALIASES: dict[str, str] = {}
# data_source prefixes (verl sends every ``aime*`` source to math_dapo): prefix -> name.
_PREFIX_ALIASES: dict[str, str] = {}


def register_reward_fn(
    name: str, scorer: Callable[..., Any], *, aliases: tuple[str, ...] = (),
    prefixes: tuple[str, ...] = (),
) -> None:
    """Register ``scorer(solution_str, ground_truth, **kwargs)`` under ``name``, its aliases
    and every data source starting with one of ``prefixes``."""
    _SCORERS[name] = scorer
    for alias in aliases:
        _ALIASES[alias] = name
    for prefix in prefixes:
        _PREFIX_ALIASES[prefix] = name


def known_data_sources() -> list[str]:
    """All names and aliases :func:`compute_score` accepts (prefixes end in ``*``), sorted."""
    return sorted({*_SCORERS, *_ALIASES, *(f"{prefix}*" for prefix in _PREFIX_ALIASES)})


def get_scorer(data_source: str) -> Callable[..., Any]:
    """The scorer registered for ``data_source``; ValueError listing known ones if none."""
    name = _ALIASES.get(data_source, data_source)
    if name not in _SCORERS:
        name = next((target for prefix, target in _PREFIX_ALIASES.items()
                     if data_source.startswith(prefix)), name)
    if name not in _SCORERS:
        raise ValueError(
            f"no reward function for data_source={data_source!r}; known data sources: "
            f"{', '.join(known_data_sources())}. Register one with "
            "rllib_grpo.rewards.register_reward_fn(name, fn) or pass reward_fn=..."
        )
    return _SCORERS[name]


@declare_isolation("thread")  # dispatches to any scorer, the parsing ones included
def compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict:
    """Score ``solution_str`` with the scorer for ``data_source`` (verl's contract).

    ``kwargs`` go to the scorer (e.g. ``method="flexible"`` for gsm8k).
    ``extra_info`` is accepted for the contract; built-in scorers ignore it.
    """
    return get_scorer(data_source)(solution_str, ground_truth, **kwargs)


def resolve_reward_fn(spec: RewardFn | str | None) -> RewardFn:
    """Turn a reward spec into a :data:`RewardFn`.

    ``spec`` is None (dispatch on ``data_source`` via :func:`compute_score`), a
    callable (used as is), ``"module:function"`` or ``"path/to/file.py:function"``
    (imported), or a registered name such as ``"gsm8k"`` (that scorer whatever
    the record's ``data_source``).
    """
    if spec is None:
        return compute_score
    if callable(spec):
        return spec
    if not isinstance(spec, str):
        raise TypeError(f"reward_fn must be a callable, a string or None, got {type(spec)}")
    if ":" in spec:
        return _import_function(spec)
    scorer = get_scorer(spec)  # fail now, naming the known sources
    # The named scorer's declared isolation (`declare_isolation`) goes with it.
    return declare_isolation(declared_isolation(scorer))(
        functools.partial(_score_with_named_scorer, spec))


def _score_with_named_scorer(
    name: str,
    data_source: str,
    solution_str: str,
    ground_truth: Any,
    extra_info: dict | None = None,
    **kwargs: Any,
) -> float | dict:
    return get_scorer(name)(solution_str, ground_truth, **kwargs)


def _import_function(spec: str) -> RewardFn:
    module_name, _, function_name = spec.rpartition(":")
    if module_name.endswith(".py"):
        path = Path(module_name)
        module_spec = importlib.util.spec_from_file_location(path.stem, path)
        if module_spec is None or module_spec.loader is None or not path.is_file():
            raise ValueError(f"reward_fn {spec!r}: no such file {path}")
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise ValueError(f"reward_fn {spec!r}: {module_name} has no function {function_name!r}")
    return function


register_reward_fn("gsm8k", score_gsm8k, aliases=("openai/gsm8k",))
register_reward_fn(
    "math",
    score_math,
    aliases=("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"),
)
# verl's DAPO data: +1/-1 (verl also sends the short name "math" here; in this package
# "math" is the 0/1 boxed-answer scorer above).
register_reward_fn("math_dapo", score_math_dapo, aliases=("math_dapo_reasoning",),
                   prefixes=("aime",))
register_reward_fn("arithmetic", score_arithmetic)
# The visual counting task (`rllib_grpo.envs.shape_count`): the answer is the last number.
register_reward_fn("shape_count", score_arithmetic)
register_reward_fn("geo3k", score_geo3k, aliases=("hiyouga/geometry3k",))
register_reward_fn("countdown", score_countdown)
