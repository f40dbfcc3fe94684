"""The demos `python -m rllib_grpo.demo` runs, by ``--model`` name.

* ``demo`` (``make demo``): the built-in 0.1M-parameter character model
  (`rllib_grpo.models.demo_model`) on one-digit sums; about a minute on a laptop CPU.
* ``smollm2-135m`` (``make demo-real``): SmolLM2-135M-Instruct, a real pretrained
  model, fine-tuned with GRPO on chat-formatted sums; accuracy on held-out sums is
  measured before and after training.
* ``demo-vlm``: the built-in tiny vision-language model (`rllib_grpo.models.demo_vlm`)
  counting shapes in pictures; held-out accuracy before and after (docs/vision.md).

`pick_demo` also serves ``--task`` (the multi-turn demos, `TASKS`, each with its built-in
warmed-up character model of `rllib_grpo.models.demo_agents`)
and ``--model FOLDER`` (a saved model trained on a demo's task instead of its built-in).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def demo_config(seed: int = 0, sampler: str = "auto") -> Any:
    """The tiny demo's GRPOConfig (also used by the learning test)."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

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


# The vision demo's task: 3x3 boards of 1-5 shapes; a fifth of the boards held out.
SHAPES_TASK = {"grid": 3, "max_count": 5, "heldout_fraction": 0.2}


def vision_demo_config(seed: int = 0, sampler: str = "auto") -> Any:
    """The tiny VLM (``builtin:demo-vlm``) counting shapes (`rllib_grpo.envs.shape_count`),
    held-out boards for validation (also used by the vision learning test).

    The language model trains alone (``freeze_vision_tower``): with the one-block vision
    tower trained too, the first updates set the counting back and it recovered slowly
    (docs/vision.md has the runs)."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/ShapeCount-v0", env_config=dict(SHAPES_TASK))
        .training(
            model_path="builtin:demo-vlm",
            prompts_per_step=16, group_size=8,
            max_prompt_length=64, max_response_length=4,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001, freeze_vision_tower=True,
            val_env_config={"split": "heldout"}, val_num_prompts=64, val_n=8,
            val_temperature=0.0,
            sampler=sampler,
        )
        .debugging(seed=seed)
    )


# ---------------------------------------------------------------- the multi-turn demos
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


# The real model's task: one-digit sums asked as a chat question ("What is 3 + 4? Answer
# with a number.").  A quarter of the 100 sums is held out (`rllib_grpo.envs.arithmetic`):
# training never draws them, the before/after evaluation draws only them.
SMOLLM2_TASK = {"max_operand": 9, "prompt_style": "chat", "heldout_fraction": 0.25}


def smollm2_config(seed: int = 0, sampler: str = "auto") -> Any:
    """SmolLM2-135M-Instruct on one-digit sums (chat template), sized for a 2-core CPU.

    Sampling at temperature 1, the model mostly rambles ("What a delightful moment...")
    and gets fewer than a third of its answers right (greedy: two in three); GRPO teaches
    it to answer briefly and right in 15 steps (held-out accuracy: docs/demo.md).  No KL term: the reference forward would cost a fifth of
    each step on CPU, and 15 small steps stay close to the start anyway.

    On a CPU with native bf16 matmuls (`cpu_has_bf16_matmul`: avx512_bf16, AMX) the learner
    computes in bf16 over fp32 master weights (faster learner steps there); the
    samplers keep float32 weights either way.
    """
    from rllib_grpo.models.precision import cpu_has_bf16_matmul
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    bf16 = cpu_has_bf16_matmul()

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
            model_dtype="bfloat16" if bf16 else "auto",
            sampler_config={"dtype": "float32"} if bf16 else {},
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
    eval_args: str | None = None  # `rllib-grpo eval MODEL ...` arguments for the same task


def _eval_args(env_config: dict[str, Any], max_response_length: int, extra: str = "") -> str:
    return (f"--env rllib_grpo/Arithmetic-v0 --env-config '{json.dumps(env_config)}' "
            f"--max-response-length {max_response_length}{extra}")


DEMOS: dict[str, DemoSpec] = {
    spec.name: spec for spec in (
        DemoSpec("demo", demo_config, iterations=400, target_reward=0.9, heldout=False,
                 title="GRPO on rllib_grpo/Arithmetic-v0 (built-in demo model, CPU)",
                 eval_args=_eval_args({"max_operand": 4}, 4)),
        DemoSpec("demo-vlm", vision_demo_config, iterations=60, target_reward=None,
                 heldout=True, title="GRPO: builtin:demo-vlm counting shapes (CPU)"),
        DemoSpec("smollm2-135m", smollm2_config, iterations=15, target_reward=None,
                 heldout=True, title="GRPO: SmolLM2-135M-Instruct on one-digit sums (CPU)",
                 eval_args=_eval_args({**SMOLLM2_TASK, "split": "heldout"}, 16,
                                      " --temperature 0 --n 1")),
    )
}


def pick_demo(model: str, task: str = "arithmetic") -> DemoSpec:
    """The demo that ``--model`` and ``--task`` name.

    ``model`` is a `DEMOS` name or a saved model folder, which then replaces the task's
    built-in model; ``task`` is ``arithmetic`` or one of `TASKS`.
    Raises ValueError, naming the fix, for an unknown model or a pair that does not fit.
    """
    folder = None if model in DEMOS else model
    if folder is not None and not (Path(folder).expanduser() / "config.json").is_file():
        raise ValueError(f"--model {model}: neither a demo ({', '.join(sorted(DEMOS))}) nor a "
                         "saved model folder (one with config.json)")
    if task == "arithmetic":
        spec = DEMOS[model] if folder is None else DEMOS["demo"]
        if folder is None:
            return spec
        base = spec.build_config
        return dataclasses.replace(
            spec, name=folder, title=f"GRPO on rllib_grpo/Arithmetic-v0 ({Path(folder).name})",
            build_config=lambda seed, sampler: base(seed, sampler).training(model_path=folder))
    if task not in TASKS:
        raise ValueError(f"--task {task}: choose arithmetic or one of {', '.join(TASKS)}")
    if model not in ("demo", folder):
        raise ValueError(f"--model {model} trains on one-digit sums only: drop --task {task} "
                         "(or give --model a saved model folder)")
    return DemoSpec(task, lambda seed, sampler: task_config(task, seed, sampler, folder),
                    iterations=400, target_reward=0.9, heldout=False,
                    title=f"GRPO on {task} (multi-turn demo, CPU)")
