"""The reward plan of a config: which rewards score a response, where each runs, its memory.

`reward_specs` reads ``reward_funcs`` / ``reward_weights`` (TRL) or ``reward_model_enable``
/ ``reward_model_path`` (verl); None means the env's own reward alone (no mixture, as
before).  `reward_plan_errors` is the door's check (a missing or non-classifier model
folder, a judge template without its placeholders, an unreachable URL: one line each,
before Ray starts); `reward_plan_lines` is what `explain` prints.  No Ray here.
"""

from __future__ import annotations

import math
from pathlib import Path

from rllib_grpo.models.model_registry import (
    HUB_ID,
    WEIGHT_FILES,
    builtin_model_names,
    model_path_error,
)
from rllib_grpo.rewards.judge import DEFAULT_TEMPLATE, JudgeRule, template_error
from rllib_grpo.rewards.remote import url_error
from rllib_grpo.rewards.reward_model import classifier_folder_error
from rllib_grpo.rewards.specs import RewardSpec, parse_reward_specs
from rllib_grpo.rllib.config.settings import GRPOSettings

# The algorithm stores the name prefix of its reward actors on the config under this
# attribute before the env runners are built (they look the actors up by name).
REWARD_ACTOR_PREFIX = "_reward_actor_prefix"


def reward_specs(c: GRPOSettings) -> list[RewardSpec] | None:
    """The rewards of a run, or None when the env's own reward scores alone.  ValueError
    for a malformed list (`reward_plan_errors` reports it at the door)."""
    funcs = c.reward_funcs
    if c.reward_model_enable:
        if funcs is not None:
            raise ValueError("reward_model_enable (verl reward_model.enable) and reward_funcs "
                             "both choose the rewards: give one of them")
        if not c.reward_model_path:
            raise ValueError("reward_model_enable=True needs reward_model_path (verl "
                             "reward_model.model.path): the sequence-classification model")
        funcs = [c.reward_model_path]
    if funcs is None:
        return None
    return parse_reward_specs(funcs, c.reward_weights)


def reward_dtype(c: GRPOSettings) -> str:
    """``reward_model_dtype`` resolved: auto is bfloat16 on GPU actors, float32 on CPU."""
    if c.reward_model_dtype != "auto":
        return c.reward_model_dtype
    return "bfloat16" if c.num_gpus_per_reward_worker > 0 else "float32"


def _local_folder(path: str) -> Path | None:
    """The folder a model name loads from now, or None (a built-in not built yet)."""
    from rllib_grpo.models.model_registry import needs_build, resolve_model

    if path in builtin_model_names():
        return None if needs_build(path) else Path(resolve_model(path))
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder
    if not HUB_ID.fullmatch(path):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    cached = try_to_load_from_cache(path, "config.json")
    return Path(cached).parent if isinstance(cached, str) else None


def _spec_errors(c: GRPOSettings, spec: RewardSpec) -> list[str]:
    where = f"reward_funcs[{spec.name!r}]"
    if spec.kind in ("model", "judge") and spec.on_actors:
        problem = model_path_error(str(spec.source), allow_hub_download=getattr(
            c, "allow_hub_download", False))
        if problem:
            return [f"{where}: {problem.replace('model_path=', 'model ', 1)}."]
        folder = _local_folder(str(spec.source))
        if spec.kind == "model" and folder is not None:
            problem = classifier_folder_error(folder)
            if problem:
                return [f"{where}: {problem}."]
    errors = []
    if spec.kind == "judge":
        for problem in (template_error(spec.options.get("template", DEFAULT_TEMPLATE)),
                        JudgeRule.from_options(spec.options).error()):
            if problem:
                errors.append(f"{where}: {problem}.")
    if spec.url is not None and (problem := url_error(spec.url)):
        errors.append(f"{where}: {problem}.")
    if not math.isfinite(spec.weight):
        errors.append(f"{where}: weight {spec.weight} must be a finite number.")
    return errors


def reward_plan_errors(c: GRPOSettings) -> list[str]:
    """The door's reward checks, one line per problem (module docstring)."""
    errors = []
    for field, minimum in (("num_reward_workers", 1), ("reward_batch_size", 1),
                           ("num_gpus_per_reward_worker", 0), ("reward_model_timeout_s", 0)):
        value = getattr(c, field)
        if not isinstance(value, int | float) or isinstance(value, bool) or value < minimum \
                or (field == "reward_model_timeout_s" and value <= 0):
            errors.append(f"{field}={value!r} must be a number >= {minimum}"
                          + (" (and > 0)" if field == "reward_model_timeout_s" else "") + ".")
    try:
        specs = reward_specs(c)
    except (ValueError, TypeError) as err:
        return [*errors, f"reward_funcs: {err}."]
    for spec in specs or []:
        errors += _spec_errors(c, spec)
    return errors


def _weights_bytes(path: str) -> int | None:
    folder = _local_folder(path)
    if folder is None:
        return None
    return sum(f.stat().st_size for pattern in WEIGHT_FILES if not pattern.endswith(".json")
               for f in folder.glob(pattern))


def _where(c: GRPOSettings, spec: RewardSpec) -> str:
    if spec.kind == "function":
        return "in each env runner (reward worker processes or threads, reward_timeout_s)"
    if spec.kind == "remote":
        return f"HTTP POST to {spec.url} (OpenRLHF protocol), one request per batch"
    if not spec.on_actors:
        return f"OpenAI-compatible server {spec.url}, model {spec.source}"
    gpus = c.num_gpus_per_reward_worker
    size = _weights_bytes(str(spec.source))
    memory = ("size unknown until built" if size is None else
              f"~{size / 2**20:.1f} MiB of weights on disk per actor")
    engine = ("" if spec.kind == "model" else
              f", {spec.options.get('parse', 'range')} rule, "
              + ("one forward pass" if spec.options.get("parse") == "yes"
                 else f"generates with the {spec.options.get('sampler', 'auto')} sampler"))
    return (f"{c.num_reward_workers} Ray actor(s) x {gpus:g} GPU ({reward_dtype(c)}, "
            f"{c.reward_batch_size} samples per forward{engine}); {memory}")


def reward_plan_lines(c: GRPOSettings) -> list[str]:
    """``explain``'s reward lines: each reward, its weight, where it runs and its memory."""
    try:
        specs = reward_specs(c)
    except (ValueError, TypeError):
        return ["rewards:                       (invalid, see ERRORS)"]
    if specs is None:
        return ["rewards:                       the env's own reward (env_config.reward_fn, "
                "else each row's data_source)"]
    lines = [f"rewards:                       score = weighted sum of {len(specs)}, each "
             "logged as reward/<name>/mean; None = does not apply"]
    for spec in specs:
        lines.append(f"  - {spec.name} ({spec.kind}, weight {spec.weight:g}): {_where(c, spec)}")
    return lines


def actor_specs(c: GRPOSettings) -> list[RewardSpec]:
    """The rewards that run on reward actors (reward models and local judges)."""
    try:
        specs = reward_specs(c) or []
    except (ValueError, TypeError):
        return []
    return [spec for spec in specs if spec.on_actors]


def actor_names(prefix: str, spec: RewardSpec, num_workers: int) -> list[str]:
    """The Ray actor names of one reward's actors."""
    return [f"{prefix}.{spec.name}.{i}" for i in range(num_workers)]


def reward_worker_seats(c: GRPOSettings) -> list[tuple[str, float]]:
    """``(label, GPUs)`` of every reward actor the run starts, in start order (the
    placement plan gives each a bundle of the run's placement group)."""
    return [(f"reward worker {spec.name}[{i}]", float(c.num_gpus_per_reward_worker))
            for spec in actor_specs(c) for i in range(c.num_reward_workers)]
