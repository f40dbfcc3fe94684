"""``RewardScorer``: call a reward function safely and normalise what it returns.

A reward function that raises, hangs or returns garbage must not stop training
(docs/grpo-semantics.md section 9.6): the sample scores 0, the result says
``reward_error: True`` with the message, the error is counted and logged
(first few, then every 100th), and the run goes on.

Calls run in a `rllib_grpo.rewards.pool.RewardPool`, in parallel, each with its own
deadline: user reward functions in forked worker processes, killed when they overrun;
the built-in scorers on threads.  `score_many` scores a whole batch at once.

A score is checked in the dtype scores are trained in (float32): 1e39 is finite as a
Python float but infinite there, so it is an error-scored sample, not a NaN advantage.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from rllib_grpo.rewards.pool import DEFAULT_REWARD_WORKERS, POOL_MODES, RewardPool
from rllib_grpo.rewards.registry import RewardFn, is_builtin_reward_fn, resolve_reward_fn

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
        workers: most reward calls at once (`score_many`).
        isolation: ``"auto"`` (processes for user functions, threads for the built-in
            scorers), ``"process"``, ``"thread"`` or ``"inline"``.

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
        workers: int = DEFAULT_REWARD_WORKERS,
        isolation: str = "auto",
    ) -> None:
        if isolation not in POOL_MODES:
            raise ValueError(f"reward isolation {isolation!r}: use one of {POOL_MODES}")
        self.reward_fn = resolve_reward_fn(reward_fn)
        self.timeout_s = timeout_s
        self.format_score = float(format_score)
        self.max_answer_chars = max_answer_chars
        self.reward_kwargs = dict(reward_kwargs or {})
        self.num_calls = 0
        self.num_errors = 0
        self.num_timeouts = 0
        self.last_error: str | None = None
        if isolation == "auto":
            isolation = "thread" if is_builtin_reward_fn(self.reward_fn) else "process"
        if not timeout_s and isolation != "inline" and workers <= 1:
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


def normalize_reward_result(value: Any) -> dict:
    """verl's return contract -> ``{"score", "acc", "pred", "reward_error", ...}``.

    A number is the score (and, as in verl's DAPO manager, also ``acc``); a dict
    must hold ``"score"``. Raises TypeError/ValueError for anything else and for
    non-finite scores.
    """
    if isinstance(value, numbers.Real):
        extras: dict = {}
        score = float(value)
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
    if not isinstance(value, numbers.Real):
        raise TypeError(f"reward score must be a number, got {type(value).__name__}")
    if not math.isfinite(float(value)):
        raise ValueError(f"reward score must be finite, got {value}")
    with np.errstate(over="ignore"):
        trained = SCORE_DTYPE(value)
    if not np.isfinite(trained):
        raise ValueError(f"reward score {value!r} is infinite in {np.dtype(SCORE_DTYPE).name}, "
                         "the dtype scores are trained in; scale the reward down")
    return float(value)
