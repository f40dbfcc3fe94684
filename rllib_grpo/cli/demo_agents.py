"""The multi-turn demos: GRPO on ``rllib_grpo/ToolArithmetic-v0`` and ``rllib_grpo/GuessNumber-v0``.

    python -m rllib_grpo.demo --task tool-arithmetic   # the calculator pays
    python -m rllib_grpo.demo --task guess-number      # higher/lower over several turns

Each uses its built-in warmed-up character-level model (`rllib_grpo.models.demo_agents`);
the progress line adds the multi-turn metrics (turns per episode, tool calls per
episode and their success rate: `rllib_grpo.cli.console.COLUMNS`).
"""

from __future__ import annotations

TASKS = ("tool-arithmetic", "guess-number")


def tool_arithmetic_config(seed: int = 0, sampler: str = "auto", model_path: str | None = None):
    """GRPO on ToolArithmetic-v0 with ``builtin:demo-tools`` (also used by its learning test).

    Budget: a tool call is ~14 tokens, the result ~8, the answer ~7; 32 tokens in all.
    """
    return _episode_config("rllib_grpo/ToolArithmetic-v0", {"max_turns": 3},
                           model_path or "builtin:demo-tools", seed, sampler,
                           max_response_length=32, max_tokens_per_turn=16)


def guess_number_config(seed: int = 0, sampler: str = "auto", model_path: str | None = None):
    """GRPO on GuessNumber-v0 with ``builtin:demo-guess`` (also used by its learning test)."""
    return _episode_config("rllib_grpo/GuessNumber-v0", {}, model_path or "builtin:demo-guess",
                           seed, sampler, max_response_length=24, max_tokens_per_turn=4)


def _episode_config(env: str, env_config: dict, model_path: str, seed: int, sampler: str,
                    max_response_length: int, max_tokens_per_turn: int):
    """What both multi-turn demos share: 16 prompts x 8 episodes, lr 1e-3, KL loss 0.001."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    return (
        GRPOConfig()
        .environment(env, env_config=env_config)
        .training(
            model_path=model_path, prompts_per_step=16, group_size=8, max_prompt_length=16,
            max_response_length=max_response_length, max_tokens_per_turn=max_tokens_per_turn,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001, sampler=sampler,
        )
        .debugging(seed=seed)
    )


def task_config(task: str, seed: int = 0, sampler: str = "auto", model_path: str | None = None):
    """The GRPOConfig of a multi-turn demo task (see `TASKS`)."""
    if task == "tool-arithmetic":
        return tool_arithmetic_config(seed, sampler, model_path)
    if task == "guess-number":
        return guess_number_config(seed, sampler, model_path)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")
