"""``RewardScorer``: call a reward function safely and normalise what it returns.

A reward function that raises, hangs or returns garbage must not stop training
(grpo-semantics.md section 9.6): the sample scores 0, the result says
``reward_error: True`` with the message, the error is counted and logged
(first few, then every 100th), and the run goes on.

Timeouts use a daemon worker thread, not signals, so they work off the main
thread (Ray actors, env runner threads). A call that overruns is abandoned with
its thread, which exits once the call returns; Python cannot kill a thread.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import math
import numbers
import queue
import threading
from collections.abc import Mapping
from typing import Any

from rllib_grpo.rewards.registry import RewardFn, resolve_reward_fn

logger = logging.getLogger(__name__)

DEFAULT_REWARD_TIMEOUT_S = 10.0
_LOGGED_ERRORS_FIRST = 5
_LOGGED_ERRORS_EVERY = 100


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
    ) -> None:
        self.reward_fn = resolve_reward_fn(reward_fn)
        self.timeout_s = timeout_s
        self.format_score = float(format_score)
        self.max_answer_chars = max_answer_chars
        self.reward_kwargs = dict(reward_kwargs or {})
        self.num_calls = 0
        self.num_errors = 0
        self.num_timeouts = 0
        self.last_error: str | None = None
        self._runner = _TimeoutRunner()

    def __call__(
        self,
        data_source: str,
        solution_str: str,
        ground_truth: Any,
        extra_info: dict | None = None,
    ) -> dict:
        """Score one response; see the class docstring for the result."""
        self.num_calls += 1
        if self.max_answer_chars is not None:
            solution_str = solution_str[-self.max_answer_chars :] if self.max_answer_chars else ""
        try:
            value = self._runner.run(
                self.reward_fn,
                (data_source, solution_str, ground_truth, extra_info),
                self.reward_kwargs,
                self.timeout_s,
            )
            result = normalize_reward_result(value)
        except (Exception, SystemExit) as err:  # a reward bug must not stop training
            return self._error_result(err)
        return self._apply_format_score(result)

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
    return float(value)


class _TimeoutRunner:
    """Runs calls on a daemon worker thread, giving up after a timeout."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue | None = None

    def run(self, fn, args: tuple, kwargs: dict, timeout_s: float | None):
        if not timeout_s:
            return _call(fn, args, kwargs)
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(
                target=_serve, args=(self._jobs,), daemon=True, name="reward-fn"
            ).start()
        outcome: dict = {}
        done = threading.Event()
        self._jobs.put((fn, args, kwargs, outcome, done))
        if not done.wait(timeout_s):
            self._jobs.put(None)  # the stuck worker exits when its call returns
            self._jobs = None
            raise TimeoutError(f"reward function took longer than {timeout_s} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def __getstate__(self) -> dict:  # threads do not pickle; a copy starts its own
        return {"_jobs": None}


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        fn, args, kwargs, outcome, done = job
        try:
            outcome["value"] = _call(fn, args, kwargs)
        except BaseException as err:  # noqa: BLE001 - handed to the caller
            outcome["error"] = err
        done.set()


def _call(fn, args: tuple, kwargs: dict):
    value = fn(*args, **kwargs)
    if inspect.isawaitable(value):  # verl allows ``async def`` reward functions
        value = asyncio.run(_await(value))
    return value


async def _await(awaitable):
    return await awaitable
