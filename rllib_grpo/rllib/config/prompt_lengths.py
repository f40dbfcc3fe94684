"""The door's prompt measure: every prompt the env will serve, rendered and tokenized as the
env does, against ``max_prompt_length`` before any process starts.

Under ``truncation="error"`` an over-long prompt is refused here (count, the first one, its
length and the fixes) instead of inside an env runner; under ``left`` / ``right`` /
``middle`` or ``filter_overlong_prompts`` `prompt_length_lines` states how many prompts are
cut or dropped.  The env is built with `make_text_env` (the env runners' own factory)
without a length limit, and its prompts go through `prompt_token_lengths` (the env's own
rendering: same chat template, same special tokens), so the door sees what the run sees.

Prompts with images are measured with the vision-language model's processor: their lengths
include every image's tokens, which ``image_tokens`` also holds per prompt.

Measured lengths are cached per (env, its options, data files as they are on disk, model),
so repeated `GRPOConfig.validate` calls measure once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rllib_grpo.envs.datasets import prompt_token_lengths
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.text_env import (
    VALIDATION_SEED_OFFSET,
    data_seed,
    env_class,
    make_text_env,
    validation_env_config,
)

logger = logging.getLogger(__name__)

# What the env must be built without, to see every prompt at its full length.
_UNLIMITED = {"tokenizer": None, "max_prompt_length": None, "truncation": "error",
              "filter_overlong_prompts": False}
_CACHE_SIZE = 16
_cache: dict[tuple, PromptLengths | None] = {}


@dataclasses.dataclass(frozen=True)
class PromptLengths:
    """Token counts of an env's prompts, in dataset order, with where each came from."""

    lengths: tuple[int, ...]
    wheres: tuple[str, ...]
    image_tokens: tuple[int, ...] = ()  # per prompt, the image tokens its length includes

    def overlong(self, max_prompt_length: int) -> list[int]:
        """Indices of the prompts longer than ``max_prompt_length``."""
        return [i for i, n in enumerate(self.lengths) if n > max_prompt_length]


@dataclasses.dataclass(frozen=True)
class _Limit:
    """The length settings the env will get (``env_config`` may override the config's)."""

    field: str  # "env_config" or "val_env_config"
    max_prompt_length: int | None
    truncation: str
    filter_overlong_prompts: bool


def prompt_length_errors(c: GRPOSettings) -> list[str]:
    """Over-long prompts under ``truncation="error"`` (the env would refuse them when it
    loads), and a ``filter_overlong_prompts`` that drops every prompt."""
    errors = []
    for limit, measured in _measured(c):
        if limit.max_prompt_length is None:
            continue
        overlong = measured.overlong(limit.max_prompt_length)
        if limit.filter_overlong_prompts and len(overlong) == len(measured.lengths):
            errors.append(f"{limit.field}: filter_overlong_prompts drops all "
                          f"{len(overlong)} prompts (the shortest is {min(measured.lengths)} "
                          f"tokens, max_prompt_length={limit.max_prompt_length}); raise "
                          "max_prompt_length.")
        elif overlong and not limit.filter_overlong_prompts and limit.truncation == "error":
            first = overlong[0]
            where = measured.wheres[first]
            where += "" if where == f"prompt {first}" else f" (prompt {first})"
            errors.append(
                f"{limit.field}: {len(overlong)} of {len(measured.lengths)} prompts are longer "
                f"than max_prompt_length={limit.max_prompt_length} tokens (truncation='error'); "
                f"the first is {where}, "
                f"{measured.lengths[first]} tokens. Raise max_prompt_length (to "
                f"{max(measured.lengths)} keeps all), set truncation='left', 'right' or "
                "'middle', or set filter_overlong_prompts=True.")
    return errors


def prompt_length_lines(c: GRPOSettings) -> list[str]:
    """What ``max_prompt_length`` does to the measured prompts, one line per env."""
    lines = []
    for limit, measured in _measured(c):
        n, longest = len(measured.lengths), max(measured.lengths)
        head = (f"prompt lengths:                {limit.field}: {n} prompts, longest "
                f"{longest} tokens")
        if limit.max_prompt_length is None:
            lines.append(f"{head}; no limit")
            continue
        overlong = measured.overlong(limit.max_prompt_length)
        if not overlong:
            effect = f"all fit max_prompt_length={limit.max_prompt_length}"
        elif limit.filter_overlong_prompts:
            effect = (f"{len(overlong)} longer than max_prompt_length="
                      f"{limit.max_prompt_length} are dropped (filter_overlong_prompts), "
                      f"{n - len(overlong)} stay")
        elif limit.truncation == "error":
            effect = (f"{len(overlong)} longer than max_prompt_length={limit.max_prompt_length}"
                      " are refused (truncation='error', see ERRORS)")
        else:
            kept = {"left": "their last", "right": "their first",
                    "middle": "their first and last"}[limit.truncation]
            effect = (f"{len(overlong)} longer than max_prompt_length={limit.max_prompt_length}"
                      f" are cut to {kept} {limit.max_prompt_length} tokens "
                      f"(truncation={limit.truncation!r})")
        lines.append(f"{head}; {effect}")
    return lines


def _measured(c: GRPOSettings) -> Iterator[tuple[_Limit, PromptLengths]]:
    """``(limit, lengths)`` for the training env and, when it reads its own data file, the
    validation env; nothing for what cannot be measured cheaply (see `_measure`)."""
    cls = env_class(getattr(c, "env", None))
    if cls is None or not issubclass(cls, TextEnv):
        return  # not a prompt dataset env (or an unknown id, reported elsewhere)
    seed = data_seed(c)
    envs = [("env_config", dict(getattr(c, "env_config", None) or {}), seed)]
    if "path" in (getattr(c, "val_env_config", None) or {}):
        envs.append(("val_env_config", validation_env_config(c), seed + VALIDATION_SEED_OFFSET))
    for field, env_config, env_seed in envs:
        measured = _measure(c, env_config, env_seed)
        if measured is not None and measured.lengths:
            yield _limit(c, field, env_config), measured


def training_prompt_lengths(c: GRPOSettings) -> PromptLengths | None:
    """The training env's measured prompts (None: not measured, see `_measure`)."""
    cls = env_class(getattr(c, "env", None))
    if cls is None or not issubclass(cls, TextEnv):
        return None
    return _measure(c, dict(getattr(c, "env_config", None) or {}), data_seed(c))


def _limit(c: GRPOSettings, field: str, env_config: dict) -> _Limit:
    def setting(name: str) -> Any:
        return env_config.get(name, getattr(c, name))

    return _Limit(field, setting("max_prompt_length"), setting("truncation"),
                  bool(setting("filter_overlong_prompts")))


def _measure(c: GRPOSettings, env_config: dict, seed: int) -> PromptLengths | None:
    """The cached lengths of the env's prompts; None when the tokenizer is not at hand
    (a hub id, or a built-in model not built yet: the run builds it) or the env does not
    build (the other checks, or the run, name why)."""
    from rllib_grpo.models.model_registry import needs_build, resolve_model

    model_path = getattr(c, "model_path", None)
    if not isinstance(model_path, str) or needs_build(model_path):
        return None
    folder = resolve_model(model_path)
    if not Path(folder).is_dir():
        return None
    key = (repr(c.env), repr(sorted(env_config.items())), seed, bool(c.data_shuffle),
           folder, _files_stamp(env_config.get("path")))
    if key not in _cache:
        if len(_cache) >= _CACHE_SIZE:
            del _cache[next(iter(_cache))]
        _cache[key] = _measure_env(c, env_config, seed, folder)
    return _cache[key]


def _measure_env(c: GRPOSettings, env_config: dict, seed: int, folder: str
                 ) -> PromptLengths | None:
    from rllib_grpo.models.tokenizers import load_tokenizer
    from rllib_grpo.models.vision import ImagePromptProcessor, vision_model_type

    # The env's own reward is not needed to measure prompts: a user's reward function is
    # imported (and called) only in the door's child process (`checks.reward_fn_errors`).
    no_reward = {"reward_fn": None} if "reward_fn" in env_config else {}
    try:
        tokenizer = load_tokenizer(folder)
        processor = (ImagePromptProcessor.from_pretrained(folder) if vision_model_type(folder)
                     else None)
        env = make_text_env(c, None, seed, env_config=env_config,
                            overrides={**_UNLIMITED, **no_reward}, processor=processor)
    except Exception as err:  # noqa: BLE001  (other checks or the run report it)
        logger.debug("prompt lengths not measured: %s: %s", type(err).__name__, err)
        return None
    try:
        dataset = list(getattr(env, "dataset", None) or [])
        lengths = prompt_token_lengths([record.prompt for record in dataset], tokenizer)
        images = [0] * len(dataset)
        for i, record in enumerate(dataset):
            if record.images and processor is not None:
                lengths[i] = processor.num_prompt_tokens(record.prompt, record.images)
                images[i] = sum(processor.image_size_tokens(*image.size)
                                for image in record.images)
        return PromptLengths(tuple(lengths), tuple(record.where() for record in dataset),
                             tuple(images) if any(images) else ())
    finally:
        scorer = getattr(env, "scorer", None)
        if scorer is not None:
            scorer.close()


def _files_stamp(path: Any) -> tuple:
    """(file, size, mtime) of each data file: an edited file is measured again."""
    paths = path if isinstance(path, list | tuple) else [path]
    stamp = []
    for item in paths:
        if isinstance(item, str | os.PathLike):
            file = Path(item).expanduser()
            stat = file.stat() if file.is_file() else None
            stamp.append((str(file), stat and stat.st_size, stat and stat.st_mtime_ns))
    return tuple(stamp)
