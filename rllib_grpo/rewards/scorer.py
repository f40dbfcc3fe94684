"""``RewardScorer``: call a reward function safely and normalise what it returns.

A reward function that raises, hangs or returns garbage must not stop training
(docs/grpo-semantics.md section 9.6): the sample scores 0, the result says
``reward_error: True`` with the message, the error is counted and logged
(first few, then every 100th), and the run goes on.

Calls run in a `rllib_grpo.rewards.pool.RewardPool`, in parallel, each with its own
deadline: user reward functions in forked worker processes, killed when they overrun;
the built-in scorers where they declared they may run (`rllib_grpo.rewards.pool.
declare_isolation`: inline or on threads).  `score_many` scores a whole batch at once.

A score is checked in the dtype scores are trained in (float32): 1e39 is finite as a
Python float but infinite there, so it is an error-scored sample, not a NaN advantage.
Any real scalar is a score: a Python number, a numpy scalar, a 0-d numpy array or torch
tensor.  ``None`` and a dict without ``"score"`` are not a bad sample but a broken
function: `RewardContractError` stops at the first, naming the function and the value.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rllib_grpo.rewards.pool import (
    DEFAULT_REWARD_WORKERS,
    POOL_MODES,
    RewardPool,
    declared_isolation,
)
from rllib_grpo.rewards.reward_registry import RewardFn, resolve_reward_fn

logger = logging.getLogger(__name__)

DEFAULT_REWARD_TIMEOUT_S = 10.0
_LOGGED_ERRORS_FIRST = 5
_LOGGED_ERRORS_EVERY = 100
# Scores are trained in float32 (the rollout batch and the learner's reward math).
SCORE_DTYPE = np.float32


class RewardScorer:
    """Scores responses with ``reward_fn`` and never raises.

    Args:
        reward_fn: anything :func:`~rllib_grpo.rewards.resolve_reward_fn` accepts;
            None dispatches on ``data_source``.
        timeout_s: seconds one call may take (None or 0: no limit, call inline).
        format_score: score for a well-formed but wrong answer (``acc`` false and
            ``pred`` not None), verl style; 0 leaves scores as returned.
        max_answer_chars: score only the last this many characters of the
            response (verl uses 300 for gsm8k); None scores all of it.
        reward_kwargs: extra keyword arguments for every call (e.g.
            ``{"method": "flexible"}`` for gsm8k).
        workers: most reward calls at once (`score_many`); None: the CPUs this process
            may use.  Processes are forked on the first call that needs them.
        isolation: ``"auto"`` (what the function declared, `declared_isolation`:
            processes for user functions, inline or threads for the built-in scorers),
            ``"process"``, ``"thread"`` or ``"inline"``.
        none_means_not_applicable: a ``None`` return is "this reward does not apply to
            this sample" (TRL's rule when several rewards are mixed,
            `rllib_grpo.rewards.mixture`): the result says ``applies: False``.  Off (one
            reward alone), ``None`` is a broken function (`RewardContractError`).

    Calling it returns ``{"score": float, "acc": bool | float, "pred": str | None,
    "reward_error": bool, "reward_error_message": str, **extras}``.
    """

    def __init__(
        self,
        reward_fn: RewardFn | str | None = None,
        *,
        timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S,
        format_score: float = 0.0,
        max_answer_chars: int | None = None,
        reward_kwargs: Mapping[str, Any] | None = None,
        workers: int | None = DEFAULT_REWARD_WORKERS,
        isolation: str = "auto",
        none_means_not_applicable: bool = False,
    ) -> None:
        if isolation not in POOL_MODES:
            raise ValueError(f"reward isolation {isolation!r}: use one of {POOL_MODES}")
        self.reward_fn = resolve_reward_fn(reward_fn)
        self.timeout_s = timeout_s
        self.format_score = float(format_score)
        self.max_answer_chars = max_answer_chars
        self.reward_kwargs = dict(reward_kwargs or {})
        self.none_means_not_applicable = none_means_not_applicable
        self.num_calls = 0
        self.num_errors = 0
        self.num_timeouts = 0
        self.last_error: str | None = None
        if isolation == "auto":
            isolation = declared_isolation(self.reward_fn)
        if not timeout_s and isolation != "inline" and workers == 1:
            isolation = "inline"
        self.pool = RewardPool(self.reward_fn, mode=isolation, max_workers=workers,
                               timeout_s=timeout_s)

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict | None = None,
    ) -> dict:
        """Score one response; see the class docstring for the result."""
        return self.score_many([(data_source, solution_str, ground_truth, extra_info)])[0]

    def score_many(self, requests: Sequence[tuple[str, str, Any, dict | None]]) -> list[dict]:
        """Score ``(data_source, solution_str, ground_truth, extra_info)`` requests in
        parallel (each within ``timeout_s``); results in the same order."""
        calls = []
        for data_source, solution_str, ground_truth, extra_info in requests:
            if self.max_answer_chars is not None:
                solution_str = solution_str[-self.max_answer_chars:] if self.max_answer_chars else ""
            calls.append(((data_source, solution_str, ground_truth, extra_info),
                          self.reward_kwargs))
        self.num_calls += len(calls)
        results = []
        for ok, value in self.pool.map(calls):
            if ok and value is None and self.none_means_not_applicable:
                results.append(not_applicable_result())
                continue
            if ok and is_contract_violation(value):  # the function is wrong, not the sample
                raise RewardContractError(self.reward_fn, value)
            try:  # a reward bug must not stop training
                if not ok:
                    raise value
                results.append(self._apply_format_score(normalize_reward_result(value)))
            except (Exception, SystemExit) as err:
                results.append(self._error_result(err))
        return results

    def close(self) -> None:
        """End the reward workers."""
        self.pool.close()

    def get_state(self) -> dict:
        """Error counters, for checkpoints."""
        return {
            "num_calls": self.num_calls,
            "num_errors": self.num_errors,
            "num_timeouts": self.num_timeouts,
        }

    def set_state(self, state: Mapping[str, int]) -> None:
        """Restore counters saved by :meth:`get_state`."""
        self.num_calls = int(state["num_calls"])
        self.num_errors = int(state["num_errors"])
        self.num_timeouts = int(state["num_timeouts"])

    def _apply_format_score(self, result: dict) -> dict:
        if self.format_score and not result["acc"] and result["pred"] is not None:
            result["score"] = max(result["score"], self.format_score)
        return result

    def _error_result(self, err: BaseException) -> dict:
        self.num_errors += 1
        self.num_timeouts += isinstance(err, TimeoutError)
        message = f"{type(err).__name__}: {err}"
        self.last_error = message
        if self.num_errors <= _LOGGED_ERRORS_FIRST or self.num_errors % _LOGGED_ERRORS_EVERY == 0:
            logger.warning(
                "reward function failed (%d so far), score 0: %s", self.num_errors, message
            )
        return {
            "score": 0.0,
            "acc": False,
            "pred": None,
            "reward_error": True,
            "reward_error_message": message,
        }


def not_applicable_result() -> dict:
    """The result of a reward that does not apply to a sample (it returned ``None``)."""
    return {"score": 0.0, "acc": False, "pred": None, "reward_error": False,
            "reward_error_message": "", "applies": False}


class RewardContractError(TypeError):
    """A reward function returned ``None`` or a dict without ``"score"``: a programming
    error in the function (every sample would silently score 0), so the run stops."""

    def __init__(self, fn: RewardFn, value: Any) -> None:
        super().__init__(f"reward function {describe_function(fn)} returned "
                         f"{type(value).__name__} {value!r:.80}; it must return a number or a "
                         "dict with 'score'")


def describe_function(fn: RewardFn) -> str:
    """``name (file:line)`` of a reward function, as far as it can be told."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(target, "__qualname__", None) or repr(target)
    code = getattr(inspect.unwrap(target), "__code__", None)
    return f"{name} ({code.co_filename}:{code.co_firstlineno})" if code else name


def is_contract_violation(value: Any) -> bool:
    """``None`` or a dict without ``"score"``: see `RewardContractError`."""
    return value is None or (isinstance(value, Mapping) and "score" not in value)


def as_real(value: Any) -> float | None:
    """``value`` as a float when it is a real scalar (a Python or numpy number, a 0-d
    numpy array or torch tensor; a bool counts as 0/1), else None."""
    if isinstance(value, numbers.Real):
        return float(value)
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        item = value.item()  # a 0-d array or tensor
        return float(item) if isinstance(item, numbers.Real) else None
    return None


def normalize_reward_result(value: Any) -> dict:
    """verl's return contract -> ``{"score", "acc", "pred", "reward_error", ...}``.

    A real scalar (`as_real`) is the score (and, as in verl's DAPO manager, also
    ``acc``); a dict must hold ``"score"``. Raises TypeError/ValueError for anything
    else and for non-finite scores.
    """
    real = as_real(value)
    if real is not None:
        extras: dict = {}
        score: Any = real
    elif isinstance(value, Mapping) and "score" in value:
        extras = dict(value)
        score = _finite_float(extras.pop("score"))
    else:
        raise TypeError(
            f"reward function returned {type(value).__name__} {value!r:.80}; "
            "expected a float or a dict with 'score'"
        )
    score = _finite_float(score)
    acc = extras.pop("acc", score)
    pred = extras.pop("pred", None)
    return {
        "score": score,
        "acc": acc,
        "pred": None if pred is None else str(pred),
        "reward_error": False,
        "reward_error_message": "",
        **extras,
    }


def _finite_float(value: Any) -> float:
    real = as_real(value)
    if real is None:
        raise TypeError(f"reward score must be a number, got {type(value).__name__}")
    value = real
    if not math.isfinite(value):
        raise ValueError(f"reward score must be finite, got {value}")
    with np.errstate(over="ignore"):
        trained = SCORE_DTYPE(value)
    if not np.isfinite(trained):
        raise ValueError(f"reward score {value!r} is infinite in {np.dtype(SCORE_DTYPE).name}, "
                         "the dtype scores are trained in; scale the reward down")
    return float(value)
