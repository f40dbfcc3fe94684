"""A multi-turn episode as one token sequence with a loss mask, its limits and metrics.

Layout (choice: environment tokens go into the *response* side, not the prompt):

    prompt ids | model turn 1 | env reply 1 | model turn 2 | env reply 2 | model turn 3
               |<------------------------ response ------------------------------->|
    loss_mask:   1 1 1 1 1      0 0 0 0 0     1 1 1 1        0 0 0         1 1 1

``response_mask`` is 1 on every real response token (all are attended to);
``loss_mask`` is 1 on the model's own sampled tokens only, so the policy loss,
the KL and entropy terms, the token counts of the loss aggregation and the
advantages cover model tokens and nothing the environment wrote.  Putting the
replies in the response (rather than growing the prompt) keeps one prompt per
group (the initial one, shared by the group's episodes) and one left-padded
prompt block, as in verl's agent loop.

Limits: ``max_response_length`` is the episode's whole response budget (model
and environment tokens), as verl's ``response_length`` is for multi-turn
rollouts; each model turn gets at most ``max_tokens_per_turn`` of what is left.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Why an episode stopped before the environment ended it (``truncation`` in its info).
TURN_LIMIT, TOKEN_BUDGET = "turn_limit", "token_budget"


@dataclass(frozen=True)
class EpisodeLimits:
    """Per-episode limits, in tokens and model turns.

    Attributes:
        max_response_length: tokens after the prompt, model and environment together.
        max_turns: model turns (None: the environment's own limit).
        max_tokens_per_turn: tokens of one model turn (None: whatever budget is left).
        max_observation_tokens: tokens of one environment reply; longer replies are cut
            (None: no cut beyond the budget).
        gamma: per-turn discount of the rewards: the episode's score is
            ``sum_k gamma**k * reward_k`` over its turns k = 0, 1, ...
    """

    max_response_length: int
    max_turns: int | None = None
    max_tokens_per_turn: int | None = None
    max_observation_tokens: int | None = None
    gamma: float = 1.0

    def __post_init__(self) -> None:
        for name in ("max_response_length", "max_turns", "max_tokens_per_turn",
                     "max_observation_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value} must be >= 1 (or None)")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma={self.gamma} must be in (0, 1]")

    def turn_tokens(self, used: int) -> int:
        """Tokens the next model turn may sample after ``used`` response tokens."""
        left = self.max_response_length - used
        return max(0, left if self.max_tokens_per_turn is None else
                   min(left, self.max_tokens_per_turn))


@dataclass
class Trajectory:
    """The token sequence of one episode, built turn by turn."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    model_tokens_per_turn: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    last_turn_cut: bool = False
    truncation: str | None = None

    def add_model_turn(self, token_ids: Sequence[int], log_probs: Sequence[float],
                       cut: bool) -> None:
        """The model's sampled tokens (trained on); ``cut``: ended by a token limit."""
        self.response_ids += list(token_ids)
        self.loss_mask += [1] * len(token_ids)
        self.log_probs += list(log_probs)
        self.model_tokens_per_turn.append(len(token_ids))
        self.last_turn_cut = cut

    def add_env_tokens(self, token_ids: Sequence[int]) -> None:
        """The environment's tokens (attended to, not trained on; log-prob 0)."""
        self.response_ids += list(token_ids)
        self.loss_mask += [0] * len(token_ids)
        self.log_probs += [0.0] * len(token_ids)

    def context_ids(self) -> list[int]:
        """Everything so far: what the model continues from in its next turn."""
        return [*self.prompt_ids, *self.response_ids]

    @property
    def num_turns(self) -> int:
        return len(self.model_tokens_per_turn)

    @property
    def truncated(self) -> bool:
        """Cut by a limit: the last model turn by a token limit, or the episode by the turn
        limit or the token budget (what ``mask_truncated_completions`` masks)."""
        return self.last_turn_cut or self.truncation is not None

    def episode_return(self, gamma: float) -> float:
        """``sum_k gamma**k * reward_k`` (exactly the single reward for one turn)."""
        if len(self.rewards) == 1:
            return float(self.rewards[0])
        return float(sum(gamma**k * r for k, r in enumerate(self.rewards)))


def episode_info(trajectory: Trajectory, summary: dict[str, Any]) -> dict[str, Any]:
    """The per-episode fields `episode_metrics` reads, from a trajectory and the env's summary."""
    return {
        "num_turns": trajectory.num_turns,
        "model_tokens": int(sum(trajectory.loss_mask)),
        "env_tokens": len(trajectory.loss_mask) - int(sum(trajectory.loss_mask)),
        "episode_tokens": len(trajectory.response_ids),
        "truncation": trajectory.truncation,
        "last_turn_cut": trajectory.last_turn_cut,
        "tool_calls_ok": int(summary.get("tool_calls_ok", 0)),
        "tool_calls_error": int(summary.get("tool_calls_error", 0)),
        "turn_rewards": list(trajectory.rewards),
    }


def episode_metrics(infos: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Multi-turn metrics of a step (empty for single-turn batches).

    ``num_turns/{mean,max,min}`` (verl's name), ``tool_calls/{success,error}``
    (calls in the step), ``tool_calls/success_rate``, ``tool_calls/per_episode``,
    ``response_length/tokens_per_turn`` (model tokens per model turn),
    ``episode_length/{mean,max}`` (all response tokens), ``episode_length/clip_ratio``
    (episodes stopped by the token budget), ``episode/turn_limit_ratio`` and
    ``episode/truncated_ratio`` (any limit, including a cut last turn).
    """
    rows = [info for info in infos if "num_turns" in info]
    if not rows:
        return {}
    turns = np.asarray([r["num_turns"] for r in rows], dtype=np.float64)
    ok = sum(r["tool_calls_ok"] for r in rows)
    errors = sum(r["tool_calls_error"] for r in rows)
    tokens = np.asarray([r["episode_tokens"] for r in rows], dtype=np.float64)
    model_tokens = sum(r["model_tokens"] for r in rows)
    return {
        "num_turns/mean": float(turns.mean()),
        "num_turns/max": float(turns.max()),
        "num_turns/min": float(turns.min()),
        "tool_calls/success": float(ok),
        "tool_calls/error": float(errors),
        "tool_calls/success_rate": ok / (ok + errors) if ok + errors else 0.0,
        "tool_calls/per_episode": (ok + errors) / len(rows),
        "response_length/tokens_per_turn": model_tokens / max(float(turns.sum()), 1.0),
        "episode_length/mean": float(tokens.mean()),
        "episode_length/max": float(tokens.max()),
        "episode_length/clip_ratio": float(np.mean([r["truncation"] == TOKEN_BUDGET
                                                    for r in rows])),
        "episode/turn_limit_ratio": float(np.mean([r["truncation"] == TURN_LIMIT
                                                   for r in rows])),
        "episode/truncated_ratio": float(np.mean([r["truncation"] is not None
                                                  or r["last_turn_cut"] for r in rows])),
    }
