"""Environments: the text env (`rllib_grpo.envs.text`), multi-turn envs with their tools and
sandbox, prompt datasets and chat rendering, and the built-in tasks, registered with
gymnasium as ``rllib_grpo/...``.

Importing this package imports only gymnasium: registration uses entry-point
strings, so the env modules (and the reward code) load on ``gymnasium.make``.
The env classes are also importable from here (lazily).
"""

from __future__ import annotations

import importlib
from typing import Any

import gymnasium

BUILTIN_ENV_IDS: dict[str, str] = {
    "rllib_grpo/Arithmetic-v0": "rllib_grpo.envs.arithmetic:ArithmeticEnv",
    "rllib_grpo/Countdown-v0": "rllib_grpo.envs.countdown:CountdownEnv",
    "rllib_grpo/GSM8K-v0": "rllib_grpo.envs.gsm8k:GSM8KEnv",
    "rllib_grpo/MATH-v0": "rllib_grpo.envs.math:MATHEnv",
    "rllib_grpo/Prompts-v0": "rllib_grpo.envs._file_env:PromptFileEnv",
    "rllib_grpo/ToolArithmetic-v0": "rllib_grpo.envs.tool_arithmetic:ToolArithmeticEnv",
    "rllib_grpo/GuessNumber-v0": "rllib_grpo.envs.guess_number:GuessNumberEnv",
    "rllib_grpo/ShapeCount-v0": "rllib_grpo.envs.shape_count:ShapeCountEnv",
    "rllib_grpo/Geo3K-v0": "rllib_grpo.envs.geo3k:Geo3KEnv",
}

_LAZY_CLASSES = {entry.rpartition(":")[2]: entry for entry in BUILTIN_ENV_IDS.values()}


def register_envs() -> None:
    """Register the built-in env ids with gymnasium (idempotent)."""
    for env_id, entry_point in BUILTIN_ENV_IDS.items():
        if env_id not in gymnasium.registry:
            gymnasium.register(id=env_id, entry_point=entry_point)


def __getattr__(name: str) -> Any:
    if name in _LAZY_CLASSES:
        module_name, _, class_name = _LAZY_CLASSES[name].partition(":")
        return getattr(importlib.import_module(module_name), class_name)
    raise AttributeError(f"module 'rllib_grpo.envs' has no attribute {name!r}")


__all__ = ["BUILTIN_ENV_IDS", "register_envs", *_LAZY_CLASSES]
