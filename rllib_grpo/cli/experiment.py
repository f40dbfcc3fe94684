"""Experiments for `rllib train` and `rllib-grpo explain`: files, flags and verl's keys.

Sources, later ones winning: the experiment YAML (RLlib's classic Tune shape
``<name>: {run, env, stop, config, ...}``, or a bare config mapping), ``--config``
JSON, then trailing ``key=value`` overrides (values parsed as YAML scalars).  Here: the
sources read and parsed; each one's keys are checked and translated by
`rllib_grpo.cli.config_keys.translate` before anything is built.  No Ray is started here.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rllib_grpo.cli.errors import ConfigError

EXPERIMENT_KEYS = {"run", "env", "stop", "config", "checkpoint_config", "checkpoint_freq",
                   "checkpoint_at_end", "storage_path", "local_dir", "num_samples", "name"}
CHECKPOINT_KEYS = {"checkpoint_frequency", "checkpoint_at_end", "num_to_keep"}


class _Loader(yaml.SafeLoader):
    """YAML with YAML 1.2 floats: ``1e-6`` is a number, not a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:\d[\d_]*(?:\.\d*)?|\.\d+)[eE][-+]?\d+$"),
    list("-+0123456789."),
)


@dataclasses.dataclass
class Experiment:
    """One Tune experiment: what to run, its config (canonical keys) and how to run it."""

    name: str | None = None
    algo: str = "GRPO"
    env: str | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    stop: dict[str, Any] = dataclasses.field(default_factory=dict)
    total_epochs: int | None = None
    checkpoint_freq: int = 0
    checkpoint_at_end: bool = True
    num_to_keep: int | None = None
    storage_path: str | None = None
    num_samples: int = 1
    ignored: list[str] = dataclasses.field(default_factory=list)
    mapped: list[str] = dataclasses.field(default_factory=list)
    recorded: dict[str, Any] = dataclasses.field(default_factory=dict)
    must_match: dict[str, Any] = dataclasses.field(default_factory=dict)
    verl_defaults: bool = False  # the configuration is given in verl's keys
    custom_reward: dict[str, Any] = dataclasses.field(default_factory=dict)  # verl's entries


# ----------------------------------------------------------------------------- parsing
def parse_scalar(text: str) -> Any:
    """A command-line value as a YAML scalar or flow collection (``True``, ``1e-6``, ``[a,b]``)."""
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError:
        return text


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``["a.b=1", "+c=x"]`` -> ``{"a.b": 1, "c": "x"}`` (Hydra's ``+``/``++`` prefixes allowed)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.lstrip("+").strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not key=value")
        if key.startswith("~"):
            raise ConfigError(f"override {item!r}: deleting keys (~) is not supported")
        out[key] = parse_scalar(value)
    return out


def parse_json_option(text: str | None, option: str) -> dict[str, Any]:
    """The JSON object of ``--config``/``--stop``; errors name the option."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{option}: invalid JSON ({err.msg} at column {err.colno})") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{option}: expected a JSON object, got {type(value).__name__}")
    return value


def load_yaml_file(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from ``path``; errors name the file and line."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{path}{where}: invalid YAML ({problem})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    return data


# ----------------------------------------------------------------------------- experiment files
def experiment_from_yaml(data: Mapping[str, Any], source: str) -> tuple[Experiment, dict]:
    """An experiment (without its config) and its raw config from a YAML mapping."""
    if _is_classic(data):
        (name, spec), = data.items()
    else:  # a bare config mapping
        name, spec = None, {"config": dict(data)}
    unknown = sorted(set(spec) - EXPERIMENT_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown experiment key {unknown[0]!r}; "
                          f"use {', '.join(sorted(EXPERIMENT_KEYS))}")
    for key in ("stop", "config", "checkpoint_config"):
        if not isinstance(spec.get(key) or {}, Mapping):
            raise ConfigError(f"{source}: {key!r} must be a mapping")
    exp = Experiment(name=spec.get("name", name), algo=str(spec.get("run", "GRPO")),
                     env=spec.get("env"), stop=dict(spec.get("stop") or {}))
    exp.num_samples = _int(spec, "num_samples", 1, source)
    exp.storage_path = spec.get("storage_path", spec.get("local_dir"))
    exp.checkpoint_freq = _int(spec, "checkpoint_freq", 0, source)
    exp.checkpoint_at_end = bool(spec.get("checkpoint_at_end", True))
    _apply_checkpoint_config(exp, spec.get("checkpoint_config") or {}, source)
    return exp, dict(spec.get("config") or {})


def _int(spec: Mapping[str, Any], key: str, default: int, source: str) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{source}: {key}={value!r}: expected an integer")
    return value


def _is_classic(data: Mapping[str, Any]) -> bool:
    if len(data) != 1:
        return False
    (spec,) = data.values()
    return isinstance(spec, Mapping) and bool({"run", "config", "stop", "env"} & set(spec))


def _apply_checkpoint_config(exp: Experiment, spec: Mapping[str, Any], source: str) -> None:
    unknown = sorted(set(spec) - CHECKPOINT_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown checkpoint_config key {unknown[0]!r}")
    exp.checkpoint_freq = _int(spec, "checkpoint_frequency", exp.checkpoint_freq, source)
    exp.checkpoint_at_end = bool(spec.get("checkpoint_at_end", exp.checkpoint_at_end))
    exp.num_to_keep = _int(spec, "num_to_keep", 0, source) or None
