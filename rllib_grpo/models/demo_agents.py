"""Built-in models for the multi-turn demos: ``"builtin:demo-tools"`` and ``"builtin:demo-guess"``.

Both are character-level transformers like ``builtin:demo`` (`rllib_grpo.models.demo_model`),
over a wider alphabet (digits, lower-case letters, arithmetic and punctuation)
plus whole tokens for the tool protocol (``<tool>``, ``</tool>``, ``<result>``,
``</result>``, ``calculator``, ``python``), and get the same kind of short
supervised warm-up before RL, on *multi-turn* demonstrations played against
the real environment (`play_demonstration`), with the loss on the model's
turns only:

* ``builtin:demo-tools`` (`rllib_grpo/ToolArithmetic-v0`): a ``tool_fraction`` of the
  demonstrations call the calculator and copy its result, the rest answer
  with a random number.  The model learns the format and to copy, and starts
  by calling the tool in about that fraction of episodes; since only tool
  calls reach the right answer, GRPO raises the tool use and the reward.
* ``builtin:demo-guess`` (`rllib_grpo/GuessNumber-v0`): an ``optimal_fraction`` of the
  guesses are binary search's (the middle of what the feedback so far allows),
  the rest random; GRPO raises the share of games won.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from rllib_grpo.envs.chat import ConversationRenderer
from rllib_grpo.envs.guess_number import GuessNumberEnv
from rllib_grpo.envs.multiturn import Episode, MultiTurnTextEnv
from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.models.loading import ModelAndTokenizer, build_tiny_causal_lm
from rllib_grpo.models.model_registry import register_builtin_model
from rllib_grpo.models.sft import sft_on_examples
from rllib_grpo.models.tokenizers import build_char_tokenizer

AGENT_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz+-*/=()<>:;,.?!_ \n"
PROTOCOL_TOKENS = ("<tool>", "</tool>", "<result>", "</result>", "calculator", "python")
_MODEL_SHAPE: dict[str, Any] = {"hidden_size": 64, "num_layers": 2, "num_heads": 2,
                                "num_kv_heads": 1, "intermediate_size": 256,
                                "max_position_embeddings": 128}
TOOLS_DEMO_PARAMS: dict[str, Any] = {"version": 1, "seed": 0, "num_problems": 2000,
                                     "tool_fraction": 0.3, "warmup_steps": 800,
                                     "batch_size": 64, **_MODEL_SHAPE}
GUESS_DEMO_PARAMS: dict[str, Any] = {"version": 1, "seed": 0, "num_problems": 2000,
                                     "optimal_fraction": 0.7, "warmup_steps": 300,
                                     "batch_size": 64, **_MODEL_SHAPE}
Policy = Callable[[Episode, random.Random], str]


def build_agent_tokenizer() -> Any:
    """The character tokenizer of both models (alphabet + protocol tokens)."""
    return build_char_tokenizer(AGENT_ALPHABET, added_tokens=PROTOCOL_TOKENS)


def play_demonstration(env: MultiTurnTextEnv, index: int, policy: Policy, rng: random.Random,
                       renderer: ConversationRenderer) -> tuple[list[int], list[int]]:
    """One episode of ``policy`` in ``env`` as ``(token ids, labels)``: labels on model turns.

    The tokens are what sampling would produce (prompt, each turn + EOS, the env's
    replies through the renderer), so the warm-up sees the exact training format.
    """
    tokenizer = env.tokenizer
    _, info = env.reset(options={"index": index})
    ids = list(info["prompt_token_ids"])
    labels = [-100] * len(ids)
    episode = env.start_episode(index)
    while not episode.done:
        text = policy(episode, rng)
        turn = [*tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id]
        ids += turn
        labels += turn
        result = episode.step(text)
        if not episode.done:
            reply = renderer.continuation_ids(turn, True, result.messages)
            ids += reply
            labels += [-100] * len(reply)
    return ids, labels


def _warm_up(env: MultiTurnTextEnv, policy: Policy, *, seed: int, num_problems: int,
             warmup_steps: int, batch_size: int, **shape: Any) -> ModelAndTokenizer:
    tokenizer = env.tokenizer
    model = build_tiny_causal_lm(tokenizer, seed=seed, arch="llama", **shape)
    rng, renderer = random.Random(seed), ConversationRenderer(tokenizer)
    examples = [play_demonstration(env, i, policy, rng, renderer) for i in range(num_problems)]
    sft_on_examples(model, examples, pad_id=tokenizer.pad_token_id, steps=warmup_steps,
                    lr=3e-3, batch_size=batch_size, seed=seed)
    return model, tokenizer


# ---------------------------------------------------------------------- ToolArithmetic
def tool_arithmetic_policy(tool_fraction: float) -> Policy:
    """Calls the calculator in ``tool_fraction`` of episodes (then copies the result),
    else answers a random number."""

    def policy(episode: Episode, rng: random.Random) -> str:
        if episode.turns == 0:
            if rng.random() < tool_fraction:
                return f"<tool>calculator: {episode.record.extra_info['expression']}</tool>"
            return str(rng.randint(0, 9999))
        result = re.search(r"<result>(.*?)</result>", episode.messages[-1]["content"])
        return result.group(1) if result else "0"

    return policy


def build_demo_tools_model(*, version: int, seed: int, num_problems: int, tool_fraction: float,
                           warmup_steps: int, batch_size: int, **shape: Any) -> ModelAndTokenizer:
    """``builtin:demo-tools``: the agent tokenizer and model after a tool-use warm-up."""
    env = ToolArithmeticEnv(num_problems=num_problems, seed=seed, data_seed=seed + 1,
                            tokenizer=build_agent_tokenizer(), shuffle=False)
    return _warm_up(env, tool_arithmetic_policy(tool_fraction), seed=seed,
                    num_problems=num_problems, warmup_steps=warmup_steps,
                    batch_size=batch_size, **shape)


# ---------------------------------------------------------------------- GuessNumber
def guess_number_policy(optimal_fraction: float) -> Policy:
    """Each guess is binary search's with probability ``optimal_fraction``, else random."""

    def policy(episode: Episode, rng: random.Random) -> str:
        low, high = episode.record.extra_info["low"], episode.record.extra_info["high"]
        for guess, reply in zip(episode.messages[1::2], episode.messages[2::2], strict=False):
            value = int(guess["content"])
            if reply["content"].startswith("higher"):
                low = max(low, value + 1)
            elif reply["content"].startswith("lower"):
                high = min(high, value - 1)
        if rng.random() < optimal_fraction and low <= high:
            return str((low + high) // 2)
        info = episode.record.extra_info
        return str(rng.randint(info["low"], info["high"]))

    return policy


def build_demo_guess_model(*, version: int, seed: int, num_problems: int,
                           optimal_fraction: float, warmup_steps: int, batch_size: int,
                           **shape: Any) -> ModelAndTokenizer:
    """``builtin:demo-guess``: the agent tokenizer and model after a guessing warm-up."""
    env = GuessNumberEnv(num_problems=num_problems, seed=seed, data_seed=seed + 1,
                         tokenizer=build_agent_tokenizer(), shuffle=False)
    return _warm_up(env, guess_number_policy(optimal_fraction), seed=seed,
                    num_problems=num_problems, warmup_steps=warmup_steps,
                    batch_size=batch_size, **shape)


register_builtin_model("builtin:demo-tools", build_demo_tools_model, params=TOOLS_DEMO_PARAMS)
register_builtin_model("builtin:demo-guess", build_demo_guess_model, params=GUESS_DEMO_PARAMS)
