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
    from rllib_grpo.rllib.config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/ToolArithmetic-v0", env_config={"max_turns": 3})
        .training(
            model_path=model_path or "builtin:demo-tools",
            prompts_per_step=16, group_size=8, max_prompt_length=16,
            max_response_length=32, max_tokens_per_turn=16,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001, sampler=sampler,
        )
        .debugging(seed=seed)
    )


def guess_number_config(seed: int = 0, sampler: str = "auto", model_path: str | None = None):
    """GRPO on GuessNumber-v0 with ``builtin:demo-guess`` (also used by its learning test)."""
    from rllib_grpo.rllib.config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/GuessNumber-v0")
        .training(
            model_path=model_path or "builtin:demo-guess",
            prompts_per_step=16, group_size=8, max_prompt_length=16,
            max_response_length=24, max_tokens_per_turn=4,
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
