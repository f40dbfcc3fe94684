"""`MixedRewardScorer`: several rewards side by side, the score their weighted sum.

Rule functions (each in a `RewardScorer`: process or thread pool, deadlines, errors scored
0) and batch rewards (reward models and judges on the reward actors, remote endpoints:
anything with ``score_batch(prompts, responses, ground_truths)``) score the same batch;
each batch reward is called once per batch.  Per sample:

    score = sum_i weight_i * reward_i      over the rewards that apply

TRL's rule for mixtures: a reward that returns ``None`` does not apply to that sample
(e.g. a code reward on a math prompt) and is left out of the sum; a sample that no
reward applies to is a programming error (`NoRewardAppliesError` stops the run, as
`RewardContractError` does for one reward).  A reward that fails (raises, times out, its
actor is lost for good) scores 0 for its samples with ``reward_error`` set, and the run
goes on.  Each sample's info carries ``reward_components`` ({name: value or None}); the
env runner logs their means as ``reward/<name>/mean``.  ``acc`` and ``pred`` come from the
first rule function that applies (validation's accuracy), else ``acc`` is the score.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rllib_grpo.rewards.scorer import RewardScorer, normalize_reward_result

logger = logging.getLogger(__name__)
Request = tuple[str, str, Any, "dict | None"]  # (data_source, response, ground truth, extra)


class BatchReward(Protocol):
    """A reward scored a batch at a time (a model, a judge, a remote endpoint)."""

    def score_batch(self, prompts: Sequence[Any], responses: Sequence[str],
                    ground_truths: Sequence[Any]) -> list[float | None]: ...


class NoRewardAppliesError(TypeError):
    """Every reward of a mixture returned None for a sample: nothing scores it."""


class MixedRewardScorer:
    """Scores with several weighted rewards (module docstring).

    Args:
        components: ``(name, weight, reward)``; a reward is a `RewardScorer` (a rule
            function) or a `BatchReward`.
    """

    needs_prompts = True  # TextEnv passes each sample's prompt (reward models read it)

    def __init__(self, components: Sequence[tuple[str, float, RewardScorer | BatchReward]]
                 ) -> None:
        if not components:
            raise ValueError("a reward mixture needs at least one reward")
        self.components = list(components)
        for _, _, reward in self.components:
            if isinstance(reward, RewardScorer) and len(self.components) > 1:
                reward.none_means_not_applicable = True
        self.num_calls = 0
        self.num_errors = 0
        self.seconds: dict[str, float] = {name: 0.0 for name, _, _ in self.components}
        self.last_seconds: dict[str, float] = {}  # each reward's seconds on the last batch

    @property
    def names(self) -> list[str]:
        return [name for name, _, _ in self.components]

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any,
                 extra_info: dict | None = None, *, prompt: Any = "") -> dict:
        """Score one response (see `score_many`)."""
        return self.score_many([(data_source, solution_str, ground_truth, extra_info)],
                               prompts=[prompt])[0]

    def score_many(self, requests: Sequence[Request], prompts: Sequence[Any] | None = None
                   ) -> list[dict]:
        """Score ``(data_source, response, ground_truth, extra_info)`` requests whose prompts
        are ``prompts`` (text or messages); results in order."""
        prompts = list(prompts) if prompts is not None else [""] * len(requests)
        self.num_calls += len(requests)
        per_reward = []
        for name, _, reward in self.components:
            t0 = time.perf_counter()
            per_reward.append(self._score_component(name, reward, requests, prompts))
            self.last_seconds[name] = time.perf_counter() - t0
            self.seconds[name] += self.last_seconds[name]
        return [self._combine(request, [results[i] for results in per_reward])
                for i, request in enumerate(requests)]

    def _score_component(self, name: str, reward: Any, requests: Sequence[Request],
                         prompts: Sequence[Any]) -> list[dict]:
        if isinstance(reward, RewardScorer):
            return reward.score_many(requests)
        try:
            values = reward.score_batch(prompts, [r[1] for r in requests],
                                        [r[2] for r in requests])
            if len(values) != len(requests):
                raise ValueError(f"{len(values)} scores for {len(requests)} samples")
            return [_batch_result(name, v) for v in values]
        except Exception as err:  # noqa: BLE001 - a reward failure must not stop training
            message = f"reward {name!r}: {type(err).__name__}: {err}"
            logger.warning("%s; its %d samples score 0", message, len(requests))
            return [{"score": 0.0, "reward_error": True, "reward_error_message": message}
                    for _ in requests]

    def _combine(self, request: Request, results: list[dict]) -> dict:
        components: dict[str, float | None] = {}
        score, acc, pred, errors = 0.0, None, None, []
        for (name, weight, reward), result in zip(self.components, results, strict=True):
            if result.get("applies", True) is False:
                components[name] = None
                continue
            components[name] = float(result["score"])
            score += weight * float(result["score"])
            if result.get("reward_error"):
                errors.append(result.get("reward_error_message", name))
            elif acc is None and isinstance(reward, RewardScorer):
                acc, pred = result.get("acc"), result.get("pred")
        if all(value is None for value in components.values()):
            raise NoRewardAppliesError(
                f"no reward applies to a sample of data_source={request[0]!r}: every one of "
                f"{', '.join(components)} returned None; give a reward for it")
        self.num_errors += bool(errors)
        return {"score": score, "acc": score if acc is None else acc, "pred": pred,
                "reward_error": bool(errors), "reward_error_message": "; ".join(errors),
                "reward_components": components}

    def close(self) -> None:
        """End the rule functions' workers."""
        for _, _, reward in self.components:
            if hasattr(reward, "close"):
                reward.close()

    def get_state(self) -> dict:
        """Counters, for checkpoints: each rule function's and the mixture's."""
        return {"num_calls": self.num_calls, "num_errors": self.num_errors,
                "components": {name: reward.get_state() for name, _, reward in self.components
                               if isinstance(reward, RewardScorer)}}

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Restore `get_state`'s counters (a one-reward state restores what it can)."""
        self.num_calls = int(state.get("num_calls", 0))
        self.num_errors = int(state.get("num_errors", 0))
        saved = state.get("components", {})
        for name, _, reward in self.components:
            if isinstance(reward, RewardScorer) and name in saved:
                reward.set_state(saved[name])


def _batch_result(name: str, value: Any) -> dict:
    """A batch reward's value for one sample as a result: None does not apply; an
    exception (a judgement that does not parse) scores 0 with ``reward_error``."""
    if value is None:
        return {"applies": False}
    if isinstance(value, BaseException):
        return {"score": 0.0, "reward_error": True,
                "reward_error_message": f"reward {name!r}: {type(value).__name__}: {value}"}
    return normalize_reward_result(value)

