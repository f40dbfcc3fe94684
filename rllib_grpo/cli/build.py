"""From command-line pieces to an `Experiment` and a built (not yet running) config.

`assemble` merges the experiment file, ``--config``, ``key=value`` overrides and
flags, with every key checked (`rllib_grpo.cli.config_keys.translate`);
`build_config` turns the experiment into the algorithm's `AlgorithmConfig`;
`resolve_stop` turns verl's ``trainer.total_epochs`` into iterations.
Relative file paths are made absolute against the folder the command was started in
(`absolutize_paths`): a Tune trial runs in its own folder.
"""

from __future__ import annotations

import itertools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.algorithms import default_config, resolve_algo
from rllib_grpo.cli.config_keys import (
    DICT_FIELDS,
    Translated,
    has_verl_keys,
    is_grid,
    translate,
)
from rllib_grpo.cli.experiment import (
    ConfigError,
    Experiment,
    experiment_from_yaml,
    load_yaml_file,
    parse_json_option,
    parse_overrides,
)
from rllib_grpo.cli.verl_keys import (
    VERL_CUSTOM_REWARD_NAME,
    VERL_DEFAULT_EPOCHS,
    VERL_DEFAULTS,
    VERL_MUST_MATCH,
    VERL_TO_RUN,
)

if TYPE_CHECKING:  # annotations only
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

# The env that reads verl's data files when a configuration names files but no env.
PROMPT_FILE_ENV = "rllib_grpo/Prompts-v0"


def assemble(
    file: str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    config_json: str | None = None,
    stop_json: str | None = None,
    algo: str | None = None,
    env: str | None = None,
    name: str | None = None,
    storage_path: str | None = None,
    checkpoint_freq: int | None = None,
    num_samples: int | None = None,
) -> Experiment:
    """One experiment from a YAML file, ``--config`` JSON, overrides and flags (in that order)."""
    if file:
        exp, file_config = experiment_from_yaml(load_yaml_file(file), str(file))
    else:
        exp, file_config = Experiment(), {}
    exp.algo = algo or exp.algo
    if exp.algo != "GRPO":
        resolve_algo(exp.algo)
    sources = [(file_config, str(file)), (parse_json_option(config_json, "--config"), "--config"),
               (parse_overrides(list(overrides)), "override")]
    for raw, source in sources:
        _merge(exp, translate(raw, exp.algo, source))
    # verl's defaults when the configuration is given in verl's keys: a file in verl's shape,
    # or (without a file) verl keys on the command line.
    exp.verl_defaults = exp.algo == "GRPO" and (
        has_verl_keys(file_config) if file else any(has_verl_keys(raw) for raw, _ in sources))
    exp.env = env or exp.config.pop("env", None) or exp.env
    exp.stop.update(parse_json_option(stop_json, "--stop"))
    _check_stop(exp.stop)
    _verl_run_checks(exp)
    exp.name = name or exp.name
    exp.storage_path = storage_path or exp.storage_path
    exp.checkpoint_freq = exp.checkpoint_freq if checkpoint_freq is None else checkpoint_freq
    exp.num_samples = exp.num_samples if num_samples is None else num_samples
    absolutize_paths(exp.config, Path.cwd())
    return exp


# (dict field or None for a top-level field, key) of config values that name files.
PATH_KEYS = ((None, "model_path"), ("env_config", "path"), ("val_env_config", "path"),
             ("env_config", "reward_fn"), ("val_env_config", "reward_fn"))


def absolutize_paths(config: dict[str, Any], base: Path) -> None:
    """Make the relative file paths in ``config`` absolute against ``base`` (in place).

    Data files and ``"file.py:function"`` reward specs always; ``model_path`` only when
    that folder exists (else it may be a built-in name or a hub id).  Grid searches are
    resolved value by value."""
    for field, key in PATH_KEYS:
        holder = config if field is None else config.get(field)
        if not isinstance(holder, dict) or key not in holder:
            continue
        value = holder[key]
        if is_grid(value):
            holder[key] = {"grid_search": [_absolute(key, v, base) for v in value["grid_search"]]}
        else:
            holder[key] = _absolute(key, value, base)


def _absolute(key: str, value: Any, base: Path) -> Any:
    if not isinstance(value, str) or not value or "://" in value:
        return value
    if key == "reward_fn":
        file, sep, function = value.rpartition(":")
        if not sep or not file.endswith(".py"):
            return value  # "module:function" or a registered name
        return f"{_absolute('path', file, base)}:{function}"
    path = Path(value).expanduser()
    if path.is_absolute():
        return str(path)
    if key == "model_path" and not (base / path).is_dir():
        return value
    return os.path.normpath(base / path)


def _merge(exp: Experiment, t: Translated) -> None:
    for key, value in t.config.items():
        if key in DICT_FIELDS and isinstance(value, dict):
            value = {**(exp.config.get(key) or {}), **value}
        exp.config[key] = value
    exp.ignored += [k for k in t.ignored if k not in exp.ignored]
    exp.mapped += t.mapped
    exp.recorded.update(t.recorded)
    exp.must_match.update(t.must_match)
    exp.custom_reward.update(t.custom_reward)
    run = t.run
    if "trainer.total_training_steps" in run:
        exp.stop["training_iteration"] = _run_int(run, "trainer.total_training_steps")
    if "trainer.total_epochs" in run:
        exp.total_epochs = _run_int(run, "trainer.total_epochs")
    if "trainer.save_freq" in run:
        exp.checkpoint_freq = max(0, _run_int(run, "trainer.save_freq"))
    exp.name = run.get("trainer.experiment_name", exp.name)
    exp.storage_path = run.get("trainer.default_local_dir", exp.storage_path)
    exp.mapped += [f"{k} -> {VERL_TO_RUN[k]}" for k in run]


def _verl_run_checks(exp: Experiment) -> None:
    """What verl keys imply across sources: the file env for data files, verl's epoch count,
    and keys whose value must agree with a setting."""
    if exp.algo != "GRPO":
        return
    if exp.env is None and (exp.config.get("env_config") or {}).get("path") is not None:
        exp.env = PROMPT_FILE_ENV
        exp.mapped.append(f"data.train_files without an env -> env {PROMPT_FILE_ENV} (each "
                          "row's data_source picks its reward function, as in verl)")
    if exp.verl_defaults and exp.total_epochs is None and "training_iteration" not in exp.stop:
        exp.total_epochs = VERL_DEFAULT_EPOCHS
        exp.mapped.append(f"trainer.total_epochs={VERL_DEFAULT_EPOCHS} (verl's default) -> "
                          f"{VERL_TO_RUN['trainer.total_epochs']}")
    _custom_reward_function(exp)
    for key, value in exp.must_match.items():
        field = VERL_MUST_MATCH[key]
        setting = exp.config.get(field, _default_of(exp, field))
        if value != setting:
            raise ConfigError(f"verl key {key}={value!r} differs from {field}={setting!r}: verl "
                              f"takes the overlong buffer's length from it; make them equal")
    manager = exp.recorded.get("reward_model.reward_manager")
    overlong = exp.config.get("overlong_buffer_enable", _default_of(exp, "overlong_buffer_enable"))
    if manager == "naive" and overlong:
        raise ConfigError("reward_model.reward_manager=naive has no overlong buffer in verl: set "
                          "reward_model.reward_manager=dapo or overlong_buffer.enable=False")


def _custom_reward_function(exp: Experiment) -> None:
    """verl's ``custom_reward_function.path/name/reward_kwargs`` -> ``env_config.reward_fn``
    (``"path:name"``) and ``env_config.reward_kwargs``, as verl selects its reward."""
    given = exp.custom_reward
    if given.get("path") is None:
        if given.get("name") is not None or any(k.startswith("reward_kwargs") for k in given):
            raise ConfigError("custom_reward_function.name / reward_kwargs need "
                              "custom_reward_function.path (the .py file of the function)")
        return
    spec = f"{given['path']}:{given.get('name') or VERL_CUSTOM_REWARD_NAME}"
    env_config = dict(exp.config.get("env_config") or {})
    if env_config.get("reward_fn") not in (None, spec):
        raise ConfigError(f"custom_reward_function selects {spec!r} but env_config.reward_fn is "
                          f"{env_config['reward_fn']!r}; give one of them")
    kwargs = dict(given.get("reward_kwargs") or {})
    kwargs.update({k.partition(".")[2]: v for k, v in given.items()
                   if k.startswith("reward_kwargs.")})
    env_config["reward_fn"] = spec
    if kwargs:
        env_config["reward_kwargs"] = {**(env_config.get("reward_kwargs") or {}), **kwargs}
    exp.config["env_config"] = env_config
    exp.mapped.append(f"custom_reward_function.path/name -> env_config.reward_fn={spec!r}"
                      + (f", reward_kwargs={kwargs!r}" if kwargs else ""))


def _default_of(exp: Experiment, field: str) -> Any:
    """A setting's default for this experiment: verl's when it is given in verl keys."""
    if exp.verl_defaults and field in VERL_DEFAULTS:
        return VERL_DEFAULTS[field][0]
    return getattr(default_config(exp.algo), field, None)


def _run_int(run: dict[str, Any], key: str) -> int:
    value = run[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: expected an integer")
    return value


def _check_stop(stop: dict[str, Any]) -> None:
    for key, value in stop.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"stop {key!r}={value!r}: expected a number")


def grid_points(exp: Experiment) -> list[dict[str, Any]]:
    """The concrete settings of every grid-search point (one point without a grid)."""
    keys = [k for k, v in exp.config.items() if is_grid(v)]
    choices = [exp.config[k]["grid_search"] for k in keys]
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*choices)]


def build_config(exp: Experiment, point: dict[str, Any] | None = None) -> Any:
    """The algorithm's config with the experiment's env and settings (not validated);
    ``point`` replaces grid searches with one of their values."""
    config = default_config(exp.algo)
    if exp.env:
        config.environment(exp.env)
    defaults = {field: value for field, (value, _) in VERL_DEFAULTS.items()
                } if exp.verl_defaults else {}
    if "training_iteration" in exp.stop and "total_training_steps" not in exp.config:
        defaults["total_training_steps"] = exp.stop["training_iteration"]  # the LR schedule's
    try:
        config.update_from_dict({**defaults, **exp.config, **(point or {})})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"config: {err}") from None
    return config


def config_errors(exp: Experiment) -> list[str]:
    """GRPO's setting errors at every grid point (each names the field and the fix);
    none for other algorithms."""
    if exp.algo != "GRPO":
        return []
    from rllib_grpo.rllib.config.checks import find_errors

    errors: list[str] = []
    for point in grid_points(exp):
        where = f" (at {point})" if point else ""
        errors += [e + where for e in find_errors(build_config(exp, point))
                   if e + where not in errors]
    return errors


def resolve_stop(exp: Experiment, config: GRPOConfig) -> dict[str, Any]:
    """The Tune stop criteria, with ``trainer.total_epochs`` turned into iterations; the
    config's ``total_training_steps`` (LR schedule, last-step validation) follows them
    unless it is set."""
    stop = dict(exp.stop)
    if exp.total_epochs is not None and "training_iteration" not in stop:
        stop["training_iteration"] = epochs_to_iterations(config, exp.total_epochs)
    if getattr(config, "total_training_steps", 0) is None and "training_iteration" in stop:
        config.total_training_steps = stop["training_iteration"]
    return stop


def count_prompts(config: GRPOConfig) -> int:
    """How many prompts the config's env serves (it is built without a tokenizer; with a
    vision-language model's processor, which prompts with images need)."""
    import gymnasium as gym

    from rllib_grpo.rllib.config.vision_plan import processor_for

    try:
        kwargs = {**dict(config.env_config), "seed": 0}
        if (processor := processor_for(config.model_path)) is not None:
            kwargs["processor"] = processor
        env = gym.make(config.env, disable_env_checker=True, **kwargs).unwrapped
        return int(env.num_prompts)
    except Exception as err:  # any failure to build the env: say which
        raise ConfigError(f"cannot count the prompts of {config.env!r} "
                          f"({type(err).__name__}: {err})") from None


def epochs_to_iterations(config: GRPOConfig, epochs: int) -> int:
    """verl's step count: ``epochs x (prompts // prompts_per_step)`` (at least 1)."""
    per_step = config.prompts_per_step
    if is_grid(per_step):
        raise ConfigError("trainer.total_epochs with a grid search over prompts_per_step: "
                          "set trainer.total_training_steps or --stop instead")
    try:
        num_prompts = count_prompts(config)
    except ConfigError as err:
        raise ConfigError(f"trainer.total_epochs: {err}; set trainer.total_training_steps "
                          "or --stop instead") from None
    return max(1, epochs * (num_prompts // per_step))
