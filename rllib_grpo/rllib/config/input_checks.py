"""Input checks that run before any process starts: numeric ranges, the model and the
data files.  `rllib_grpo.rllib.config.checks.find_errors` includes them, so `GRPOConfig.validate`,
`explain` and `rllib train` refuse the same inputs, each with one line naming the field.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rllib_grpo.envs.prompt_files import prompt_file_error
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.models.model_registry import model_path_error
from rllib_grpo.rllib.config.door_checks import (
    count_errors,
    env_id_error,
    logger_errors,
    reward_fn_errors,
)
from rllib_grpo.rllib.config.prompt_lengths import prompt_length_errors
from rllib_grpo.rllib.config.reward_plan import reward_plan_errors
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.text_env import env_class

# (field, predicate, requirement) for scalar settings; None values are skipped ("off").
_POSITIVE = (lambda v: v > 0, "a finite number > 0")
_NON_NEGATIVE = (lambda v: v >= 0, "a finite number >= 0")
# Fields whose range `checks` already explains; here only NaN / infinity is refused.
_FINITE = (lambda v: True, "a finite number")
_RANGES: list[tuple[str, Callable[[float], bool], str]] = [
    ("grad_clip", *_POSITIVE),
    ("clip_ratio", *_POSITIVE),
    ("clip_ratio_low", *_POSITIVE),
    ("clip_ratio_high", *_POSITIVE),
    ("clip_ratio_c", *_FINITE),
    ("temperature", *_FINITE),
    ("kl_loss_coef", *_NON_NEGATIVE),
    ("kl_coef", *_NON_NEGATIVE),
    ("kl_target", *_POSITIVE),
    ("entropy_coeff", *_NON_NEGATIVE),
    ("weight_decay", *_NON_NEGATIVE),
    ("overlong_penalty_factor", *_NON_NEGATIVE),
    ("loss_scale_factor", *_POSITIVE),
    ("rollout_is_threshold", *_FINITE),
    ("val_temperature", *_NON_NEGATIVE),
    ("top_p", lambda v: 0 < v <= 1, "a probability in (0, 1]"),
    ("lr_warmup_steps", lambda v: v == -1 or v >= 0,
     "a number of optimizer steps >= 0, or -1 (verl: use lr_warmup_steps_ratio)"),
    ("keep_checkpoints", *_NON_NEGATIVE),
    ("max_skipped_steps", *_NON_NEGATIVE),
    ("env_runner_restart_timeout_s", *_POSITIVE),
]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _lr_error(lr: Any) -> str | None:
    """``lr`` is a number > 0 or an RLlib schedule ``[[timestep, value], ...]`` of values
    >= 0 (a warm-up may start at 0), all finite."""
    if _is_number(lr):
        return None if math.isfinite(lr) and lr > 0 else (
            f"lr={lr!r} must be a finite number > 0 (verl's GRPO uses 1e-6).")
    if isinstance(lr, list | tuple) and lr and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(map(_is_number, p)) for p in lr):
        values = [p[1] for p in lr]
        if all(math.isfinite(v) and v >= 0 for v in values) and any(v > 0 for v in values):
            return None
        return f"lr schedule {lr!r}: every value must be finite and >= 0, and one > 0."
    return f"lr={lr!r} must be a number > 0 or a schedule [[timestep, lr], ...]."


def range_errors(c: GRPOSettings) -> list[str]:
    """Numbers out of their range (or NaN / infinite), each naming the field."""
    errors = [e for e in [_lr_error(getattr(c, "lr", 1.0))] if e]
    for field, ok, requirement in _RANGES:
        value = getattr(c, field, None)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or not ok(value):
            errors.append(f"{field}={value!r} must be {requirement}.")
    betas = getattr(c, "betas", (0.9, 0.999))
    if not (isinstance(betas, list | tuple) and len(betas) == 2 and all(
            _is_number(b) and 0 <= b < 1 for b in betas)):
        errors.append(f"betas={betas!r} must be two numbers in [0, 1) (AdamW's beta1, beta2).")
    return errors


def _data_paths(c: GRPOSettings) -> list[tuple[str, Any]]:
    """``(field, path)`` of every data file; a list of files (verl's ``data.train_files``
    may be one) gives one entry per file, named by its position.  A `TextEnv`'s own
    ``dataset`` option counts when it names a file (`_dataset_file`)."""
    paths = []
    for field in ("env_config", "val_env_config"):
        settings = getattr(c, field, None) or {}
        if not isinstance(settings, dict):
            continue
        if settings.get("path") is not None:
            given = settings["path"]
            if isinstance(given, list | tuple):
                paths += [(f"{field}.path[{i}]", path) for i, path in enumerate(given)]
                paths += [] if given else [(f"{field}.path", None)]  # no file: no data
            else:
                paths.append((f"{field}.path", given))
        if (dataset := _dataset_file(c, settings)) is not None:
            paths.append((f"{field}.dataset", dataset))
    return paths


def _dataset_file(c: GRPOSettings, settings: dict) -> str | Path | None:
    """The file a `TextEnv` (or subclass) loads its ``dataset`` option from, or None for
    rows given in memory (a list, a `PromptDataset`) and envs of other kinds (their
    ``dataset`` may mean something else)."""
    dataset = settings.get("dataset")
    if not isinstance(dataset, str | Path):
        return None
    cls = env_class(getattr(c, "env", None))
    return dataset if cls is not None and issubclass(cls, TextEnv) else None


def _reward_file_errors(c: GRPOSettings) -> list[str]:
    errors = []
    for field in ("env_config", "val_env_config"):
        spec = (getattr(c, field, None) or {}).get("reward_fn")
        if isinstance(spec, str) and ".py:" in spec:
            file = Path(spec.rpartition(":")[0]).expanduser()
            if not file.is_file():
                errors.append(f"{field}.reward_fn={spec!r}: no such file {file}.")
    return errors


def resource_errors(c: GRPOSettings) -> list[str]:
    """The model and the data files must exist and be readable (nothing is loaded)."""
    errors = []
    model_error = model_path_error(c.model_path,
                                   allow_hub_download=getattr(c, "allow_hub_download", False))
    if model_error:
        errors.append(model_error)
    for field, path in _data_paths(c):
        if path is None:
            errors.append(f"{field} is an empty list of files: an empty dataset.")
        elif not isinstance(path, str | Path):
            errors.append(f"{field}={path!r} must be a file path.")
        elif problem := prompt_file_error(Path(path).expanduser()):
            errors.append(f"{field}: {problem}.")
    return errors + _reward_file_errors(c)


def input_errors(c: GRPOSettings) -> list[str]:
    """`range_errors`, `resource_errors` and the door's checks (`door_checks`): counts,
    the env id, one call of the reward function and, when the env and its files are
    there, every prompt's length (`prompt_lengths`)."""
    env_error = env_id_error(getattr(c, "env", None))
    resources = resource_errors(c)
    lengths = [] if env_error or resources else prompt_length_errors(c)
    return (range_errors(c) + count_errors(c) + ([env_error] if env_error else [])
            + resources + lengths + reward_fn_errors(c) + reward_plan_errors(c)
            + logger_errors(c))
