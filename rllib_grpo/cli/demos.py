"""The demos `python -m rllib_grpo.demo` runs, by ``--model`` name.

* ``demo`` (``make demo``): the built-in 0.1M-parameter character model
  (`rllib_grpo.models.demo`) on one-digit sums; about a minute on a laptop CPU.
* ``smollm2-135m`` (``make demo-real``): SmolLM2-135M-Instruct, a real pretrained
  model, fine-tuned with GRPO on chat-formatted sums; accuracy on held-out sums is
  measured before and after training.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any


def demo_config(seed: int = 0, sampler: str = "auto") -> Any:
    """The tiny demo's GRPOConfig (also used by the learning test)."""
    from rllib_grpo.rllib.config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(
            model_path="builtin:demo",
            prompts_per_step=16, group_size=8,
            max_prompt_length=16, max_response_length=4,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001,
            sampler=sampler,
        )
        .debugging(seed=seed)
    )


# The real model's task: one-digit sums asked as a chat question ("What is 3 + 4? Answer
# with a number.").  A quarter of the 100 sums is held out (`rllib_grpo.envs.arithmetic`):
# training never draws them, the before/after evaluation draws only them.
SMOLLM2_TASK = {"max_operand": 9, "prompt_style": "chat", "heldout_fraction": 0.25}


def smollm2_config(seed: int = 0, sampler: str = "auto") -> Any:
    """SmolLM2-135M-Instruct on one-digit sums (chat template), sized for a 2-core CPU.

    Sampling at temperature 1, the model mostly rambles ("What a delightful moment...")
    and gets about one answer in six right (greedy: two in three); GRPO teaches it to
    answer briefly and right.  No KL term: the reference forward would cost a fifth of
    each step on CPU, and 15 small steps stay close to the start anyway.
    """
    from rllib_grpo.rllib.config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config=dict(SMOLLM2_TASK))
        .training(
            model_path="smollm2-135m",
            prompts_per_step=4, group_size=8,
            max_prompt_length=64, max_response_length=16,
            lr=2e-5, use_kl_loss=False,
            val_env_config={"split": "heldout"}, val_num_prompts=48, val_temperature=0.0,
            sampler=sampler,
        )
        .debugging(seed=seed)
    )


@dataclasses.dataclass(frozen=True)
class DemoSpec:
    """One demo: its config, how long it trains, and what it shows."""

    name: str
    build_config: Callable[[int, str], Any]  # (seed, sampler) -> GRPOConfig
    iterations: int  # default --iterations
    target_reward: float | None  # stop once the last 10 steps average this (None: never)
    heldout: bool  # score held-out prompts (greedy) before and after training
    title: str  # the plot's title


DEMOS: dict[str, DemoSpec] = {
    spec.name: spec for spec in (
        DemoSpec("demo", demo_config, iterations=400, target_reward=0.9, heldout=False,
                 title="GRPO on rllib_grpo/Arithmetic-v0 (built-in demo model, CPU)"),
        DemoSpec("smollm2-135m", smollm2_config, iterations=15, target_reward=None,
                 heldout=True, title="GRPO: SmolLM2-135M-Instruct on one-digit sums (CPU)"),
    )
}
