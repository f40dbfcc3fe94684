"""Multi-turn text environments: the model answers, the environment replies, until the end.

A :class:`MultiTurnTextEnv` is a gymnasium env: ``reset()`` serves a prompt as
`TextEnv` does, ``step(response)`` returns the environment's reply as the next
observation, a per-turn reward, and ``terminated`` when the task is over
(``truncated`` when the turn limit stopped it).  Internally each episode is an
:class:`Episode` object, so a runner can drive many episodes of the same env
at once (``start_episode`` / ``step_many``), which is what GRPO does: a group
is ``group_size`` episodes started from one prompt.

The default behaviour is a tool-using agent (`rllib_grpo.envs.tools`): a turn
that calls tools gets their results (a ``tool`` message), a turn without a
call is the final answer, scored by the env's reward function, which ends the
episode.  Subclasses override :meth:`MultiTurnTextEnv.respond` for other
interactions (e.g. `rllib_grpo.envs.guess_number`).

verl's multi-turn rows map where they can: ``extra_info.tools_kwargs`` names
the tools a row may use (names this env does not have are ignored, and their
``create_kwargs`` are not used), ``agent_name: "single_turn_agent"`` gives a
row no tools (one turn), and Hermes ``<tool_call>`` JSON calls are accepted.
verl's ``interaction_kwargs`` (Python interaction classes) have no equivalent
here and are ignored.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.envs.tools import Tool, ToolBox, ToolResult, has_tool_call, make_tools

DEFAULT_MAX_TURNS = 4
TOOL_ROLE = "tool"


@dataclass
class TurnResult:
    """The environment's answer to one model turn.

    ``messages`` is its reply as chat messages (``{"role", "content"}``; empty when
    the episode ends); ``info`` carries the reward function's fields
    (``score``, ``acc``, ``pred``, ``reward_error``) on scored turns.
    """

    messages: list[dict]
    reward: float
    terminated: bool
    truncated: bool = False
    info: dict = field(default_factory=dict)

    @property
    def observation(self) -> str:
        """The reply as one text (the gymnasium observation)."""
        return "".join(str(m["content"]) for m in self.messages)


class Episode:
    """One episode's state: its prompt record, the conversation so far and its tool use.

    ``state`` is free for the environment's own per-episode data (set in
    :meth:`MultiTurnTextEnv.begin_episode`).
    """

    def __init__(self, env: MultiTurnTextEnv, record: PromptRecord, seed: int | None) -> None:
        self.env = env
        self.record = record
        self.seed = seed
        self.turns = 0
        prompt = record.prompt
        self.messages: list[dict] = ([{"role": "user", "content": prompt}]
                                     if isinstance(prompt, str) else [dict(m) for m in prompt])
        self.tool_calls: Counter[str] = Counter()  # "ok" and each error kind
        self.done = False
        self.last_info: dict = {}
        self.state: dict[str, Any] = {}
        env.begin_episode(self)

    def step(self, response: str) -> TurnResult:
        """Play the model's turn ``response``; the env's reply (the turn limit applied)."""
        if self.done:
            raise RuntimeError("this episode has ended; start a new one")
        self.turns += 1
        self.messages.append({"role": "assistant", "content": response})
        result = self.env.respond(self, response)
        if not result.terminated and self.turns >= self.env.max_turns:
            # gymnasium's TimeLimit semantics: stopped by a limit, not by the task.
            result.truncated, result.messages = True, []
            result.info["truncation"] = "turn_limit"
            result.info.setdefault("acc", False)  # no answer within the limit
        self.messages.extend(result.messages)
        self.done = result.terminated or result.truncated
        self.last_info = result.info
        return result

    def record_tool_results(self, results: Sequence[ToolResult]) -> None:
        """Count the calls of a turn (``tool_calls/success|error`` metrics)."""
        for r in results:
            self.tool_calls["ok" if r.ok else r.kind] += 1

    def summary(self) -> dict[str, Any]:
        """Turns, tool-call counts by outcome and the last turn's info."""
        errors = sum(n for kind, n in self.tool_calls.items() if kind != "ok")
        return {"num_turns": self.turns, "tool_calls_ok": self.tool_calls["ok"],
                "tool_calls_error": errors,
                "tool_errors": {k: n for k, n in self.tool_calls.items() if k != "ok"},
                **self.last_info}


class MultiTurnTextEnv(TextEnv):
    """A `TextEnv` whose episodes last several turns (tool use by default).

    Args:
        dataset: as for `TextEnv`.
        max_turns: model turns per episode; the episode is truncated after them.
        tools: tool names (``["calculator", "python"]``), ``{name: options}`` or
            `Tool` objects; None or empty: no tools (every turn is a final answer).
        tool_call_reward: reward of a turn that calls tools (0: only the answer pays).
        **text_env_kwargs: `TextEnv`'s (reward_fn, tokenizer, max_prompt_length, seed, ...).
    """

    multi_turn = True

    def __init__(self, dataset: PromptDataset | list[dict] | str, *,
                 max_turns: int = DEFAULT_MAX_TURNS,
                 tools: Sequence[str | Tool] | Mapping[str, Mapping] | None = None,
                 tool_call_reward: float = 0.0, **text_env_kwargs: Any) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns={max_turns} must be >= 1")
        super().__init__(dataset, **text_env_kwargs)
        self.max_turns = int(max_turns)
        self.toolbox = ToolBox(make_tools(tools))
        self.tool_call_reward = float(tool_call_reward)
        self._episode: Episode | None = None

    # ------------------------------------------------------------------ many episodes
    def start_episode(self, index: int, *, seed: int | None = None) -> Episode:
        """A new episode on prompt ``index``; does not touch the env's prompt order."""
        return Episode(self, self.dataset[self._checked_index(index)], seed)

    def step_many(self, episodes: Sequence[Episode], responses: Sequence[str]) -> list[TurnResult]:
        """``episode.step(response)`` for each pair; turns that call slow tools run at once."""
        slow = {"python"} & set(self.toolbox.tools)
        calling = sum(has_tool_call(r) for r in responses)
        if not slow or calling < 2:
            return [e.step(r) for e, r in zip(episodes, responses, strict=True)]
        with ThreadPoolExecutor(max_workers=min(8, len(episodes))) as pool:
            return list(pool.map(lambda e, r: e.step(r), episodes, responses))

    # ------------------------------------------------------------------ behaviour (override)
    def begin_episode(self, episode: Episode) -> None:
        """Set up ``episode.state`` (nothing by default)."""

    def respond(self, episode: Episode, response: str) -> TurnResult:
        """Tool calls get their results; a turn without one is the final answer."""
        allowed = self.tools_for(episode.record)
        if allowed and has_tool_call(response):
            results = self.toolbox.run(response, allowed)
            episode.record_tool_results(results)
            reply = "".join(r.observation() for r in results)
            return TurnResult([{"role": TOOL_ROLE, "content": reply}], self.tool_call_reward,
                              False, info={"tool_results": [r.kind for r in results]})
        return self.score_answer(episode, response)

    def score_answer(self, episode: Episode, response: str) -> TurnResult:
        """Score ``response`` with the reward function and end the episode."""
        record = episode.record
        result = self.scorer(record.data_source, response, record.ground_truth,
                             record.extra_info)
        return TurnResult([], float(result["score"]), True, info=dict(result))

    def tools_for(self, record: PromptRecord) -> tuple[str, ...]:
        """The tools ``record`` may use: all, or those its verl ``tools_kwargs`` names."""
        extra = record.extra_info or {}
        if extra.get("agent_name") == "single_turn_agent":
            return ()
        named = extra.get("tools_kwargs")
        if isinstance(named, Mapping) and named:
            return tuple(name for name in named if name in self.toolbox.tools)
        return tuple(self.toolbox.tools)

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        """Serve a prompt (as `TextEnv.reset`) and start its episode."""
        observation, info = super().reset(seed=seed, options=options)
        episode_seed = (options or {}).get("episode_seed")
        self._episode = self.start_episode(info["index"], seed=episode_seed)
        info["messages"] = list(self._episode.messages)
        return observation, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        """Play one model turn: ``(reply, reward, terminated, truncated, info)``."""
        if self._episode is None or self._episode.done:
            raise RuntimeError("step() needs a running episode: call reset() first")
        if not isinstance(action, str):
            raise TypeError(f"text env actions are response strings, got {type(action).__name__}")
        clipped = len(action) > self.max_response_chars
        result = self._episode.step(action[-self.max_response_chars:] if clipped else action)
        record = self._episode.record
        info = {**result.info, "index": record.index, "turn": self._episode.turns,
                "data_source": record.data_source, "ground_truth": record.ground_truth,
                "messages": result.messages, "response_clipped": clipped}
        return (result.observation, result.reward, result.terminated, result.truncated, info)

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue the prompt order saved by `get_state` (an unfinished episode is dropped)."""
        super().set_state(state)
        self._episode = None


class ToolTextEnv(MultiTurnTextEnv):
    """A prompt dataset (file, rows or `PromptDataset`, verl's multi-turn rows included)
    with tools: ``tools=["calculator", "python"]`` by default."""

    def __init__(self, dataset: PromptDataset | list[dict] | str, *,
                 tools: Sequence[str | Tool] | Mapping[str, Mapping] | None = ("calculator",
                                                                               "python"),
                 **kwargs: Any) -> None:
        super().__init__(dataset, tools=tools, **kwargs)
