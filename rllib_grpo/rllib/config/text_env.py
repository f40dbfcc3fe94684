"""Building the configured text env: the env runners and the door (`prompt_lengths`) build
it the same way, so the door measures the prompts the run will serve."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym

from rllib_grpo.rllib.config.settings import GRPOSettings


def data_seed(config: GRPOSettings) -> int:
    """The seed of the prompt order every env runner shares: ``data_seed``, else ``seed``."""
    return config.data_seed if config.data_seed is not None else (config.seed or 0)


# The validation env's seed offset: a held-out order (and, for generated tasks, problems).
VALIDATION_SEED_OFFSET = 10_007


def validation_env_config(config: GRPOSettings) -> dict:
    """The validation env's options: ``env_config`` overridden by ``val_env_config``."""
    return {**dict(config.env_config), **dict(config.val_env_config)}


def make_text_env(config: GRPOSettings, tokenizer: Any, seed: int, *,
                  env_config: Mapping[str, Any] | None = None,
                  overrides: Mapping[str, Any] | None = None, processor: Any = None) -> gym.Env:
    """Build the configured text env (a gymnasium id or an env class) with the tokenizer
    (and a vision-language model's ``processor``, which renders prompts with images).

    ``env_config`` replaces ``config.env_config`` (the validation env's options);
    ``overrides`` win over both (the door builds the env without a length limit).
    """
    kwargs = dict(
        tokenizer=tokenizer, max_prompt_length=config.max_prompt_length,
        truncation=config.truncation, filter_overlong_prompts=config.filter_overlong_prompts,
        seed=seed,
    )
    if processor is not None:
        kwargs["processor"] = processor
    if not config.data_shuffle:  # verl data.shuffle=False: the file's order
        kwargs["shuffle"] = False
    kwargs.update(dict(config.env_config if env_config is None else env_config))
    kwargs.update(dict(overrides or {}))
    env = config.env
    if isinstance(env, str):
        return gym.make(env, disable_env_checker=True, **kwargs).unwrapped
    if isinstance(env, type):
        return env(**kwargs)
    raise ValueError(
        f"env={env!r}: GRPO needs a gymnasium id (e.g. 'rllib_grpo/Arithmetic-v0') or a "
        "TextEnv subclass."
    )


def env_class(env: Any) -> type | None:
    """The class a gymnasium id (or class) builds; None when it cannot be told."""
    if isinstance(env, type):
        return env
    if not isinstance(env, str):
        return None
    try:
        entry = gym.spec(env).entry_point
    except Exception:  # noqa: BLE001  (an unknown id: gymnasium.make reports it)
        return None
    if isinstance(entry, str):
        module, _, name = entry.partition(":")
        entry = getattr(importlib.import_module(module), name, None)
    return entry if isinstance(entry, type) else None
