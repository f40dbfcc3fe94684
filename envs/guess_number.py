"""``rllib_grpo/GuessNumber-v0``: find a secret number with higher/lower feedback.

Each prompt hides a number in ``[low, high]`` (the ground truth).  Every model
turn is a guess (the last integer in it); the environment replies ``higher``
or ``lower`` and the game goes on, until the guess is right (reward 1,
terminated) or ``max_guesses`` guesses were wrong (reward 0, terminated: the
game is lost, which is the task's outcome, not a truncation).  A turn without
a number counts as a wrong guess (``invalid``).  Binary search always wins
within ``ceil(log2(high - low + 2))`` guesses: 3 for the default ``[1, 7]``.
Per-turn rewards are 0 and the win pays 1, so with ``gamma < 1`` an earlier win
is worth more.

Plain style (the character-level ``builtin:demo-guess`` model)::

    guess 1-7:4<eos>higher:6<eos>lower:5<eos>          (prompt, then turns and replies)

Chat style: a user message with the rules; replies are short user messages.
"""

from __future__ import annotations

import random
from typing import Any

from rllib_grpo.envs.arithmetic import PROMPT_STYLES, problem_seed
from rllib_grpo.envs.datasets import PromptDataset, PromptRecord
from rllib_grpo.envs.multiturn import Episode, MultiTurnTextEnv, TurnResult
from rllib_grpo.rewards._numbers import last_number

DATA_SOURCE = "guess_number"
CHAT_RULES = ("I am thinking of an integer from {low} to {high}. Guess it: reply with one number. "
              "After each wrong guess I say 'higher' or 'lower'. You have {guesses} guesses.")


def make_guess_number_records(n: int, seed: int = 0, *, low: int = 1, high: int = 7,
                              max_guesses: int = 3, prompt_style: str = "plain"
                              ) -> list[PromptRecord]:
    """``n`` games; game ``i``'s secret depends only on ``(seed, i)``."""
    if low > high:
        raise ValueError(f"need low <= high, got low={low}, high={high}")
    if prompt_style not in PROMPT_STYLES:
        raise ValueError(f"prompt_style must be one of {PROMPT_STYLES}, got {prompt_style!r}")
    prompt: Any = (f"guess {low}-{high}:" if prompt_style == "plain" else
                   [{"role": "user", "content": CHAT_RULES.format(low=low, high=high,
                                                                  guesses=max_guesses)}])
    return [PromptRecord(prompt=prompt,
                         ground_truth=random.Random(f"guess_number:{seed}:{i}").randint(low, high),
                         data_source=DATA_SOURCE, extra_info={"low": low, "high": high,
                                                              "game": i})
            for i in range(n)]


class GuessNumberEnv(MultiTurnTextEnv):
    """Higher/lower guessing over several turns (see the module docstring).

    ``max_turns`` (the episode limit) defaults to ``max_guesses``, so every game ends
    by the rules. Other keyword arguments go to `MultiTurnTextEnv` / `TextEnv`.
    """

    def __init__(self, *, num_problems: int = 10_000, low: int = 1, high: int = 7,
                 max_guesses: int = 3, prompt_style: str = "plain", max_turns: int | None = None,
                 seed: int | None = None, data_seed: int | None = None,
                 **env_kwargs: Any) -> None:
        if max_guesses < 1:
            raise ValueError(f"max_guesses={max_guesses} must be >= 1")
        records = make_guess_number_records(num_problems, problem_seed(seed, data_seed),
                                            low=low, high=high, max_guesses=max_guesses,
                                            prompt_style=prompt_style)
        super().__init__(PromptDataset(records, name="guess_number"),
                         max_turns=max_turns or max_guesses, tools=None, seed=seed, **env_kwargs)
        self.max_guesses = max_guesses
        self.plain = prompt_style == "plain"

    def respond(self, episode: Episode, response: str) -> TurnResult:
        secret = int(episode.record.ground_truth)
        guess = last_number(response)
        value = int(float(guess)) if guess is not None and _is_integer(guess) else None
        info = {"pred": guess, "guesses": episode.turns}
        if value == secret:
            return TurnResult([], 1.0, True, info={**info, "acc": True, "score": 1.0})
        if episode.turns >= self.max_guesses:
            return TurnResult([], 0.0, True, info={**info, "acc": False, "score": 0.0,
                                                   "lost": True})
        if value is None:
            feedback = "invalid"
        else:
            feedback = "higher" if value < secret else "lower"
        content = f"{feedback}:" if self.plain else f"{feedback}"
        return TurnResult([{"role": "user", "content": content}], 0.0, False, info=info)


def _is_integer(text: str) -> bool:
    try:
        return float(text).is_integer()
    except ValueError:
        return False

