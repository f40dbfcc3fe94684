"""Every key of one configuration source checked and put in canonical form, for
`rllib train` and `rllib-grpo explain` (the sources themselves: `rllib_grpo.cli.experiment`).

RLlib's `update_from_dict` would silently set an unknown key, so each is checked before
anything is built: a GRPO setting, a verl dotted name from `VERL_ALIASES`, a verl key
handled by the tables of `rllib_grpo.cli.verl_keys` (ignored, run settings, dict entries,
recorded, refused parallel layouts), or an attribute of the algorithm's fresh config.  Any
other verl key is refused by name.  A configuration given in verl's keys starts from verl's
defaults (`rllib_grpo.cli.verl_keys.VERL_DEFAULTS`).  Values are checked against the
settings' declared types (a Tune grid search point by point).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

from rllib_grpo.cli.algorithms import default_config
from rllib_grpo.cli.errors import ConfigError
from rllib_grpo.cli.verl_keys import (
    REWARD_MANAGERS,
    VERL_CUSTOM_REWARD_ENTRIES,
    VERL_CUSTOM_REWARD_PREFIXES,
    VERL_IGNORED,
    VERL_IGNORED_AT,
    VERL_IGNORED_PREFIXES,
    VERL_MUST_MATCH,
    VERL_PREFIX_TO_DICT,
    VERL_RECORDED,
    VERL_REFUSED_LAYOUTS,
    VERL_REFUSED_PREFIXES,
    VERL_TO_RUN,
    VERL_TO_SUB_KEY,
    VERL_TOP_LEVEL,
    known_verl_keys,
    prefix_match,
)
from rllib_grpo.rllib.config.gpu_layout import colocated_layout
from rllib_grpo.rllib.config.settings import (
    DERIVED_FIELDS,
    EVALUATION_ALIASES,
    SETTINGS_FIELDS,
    VERL_ALIASES,
    canonical_dtype,
    derived_field_error,
    did_you_mean,
    is_dtype_setting,
)

# Top-level sections of verl's config: a dotted key under one of them is a verl key.
VERL_ROOTS = ("algorithm", "actor_rollout_ref", "data", "trainer", "critic", "reward_model",
              "reward", "custom_reward_function", "ray_init", "ray_kwargs", "global_profiler")
# RLlib's `update_from_dict` renames these; classic configs use them.
RLLIB_SPECIAL_KEYS = {"callbacks", "create_env_on_driver", "custom_eval_function", "framework",
                      "input", "lambda", "num_cpus_for_driver", "num_workers", "multiagent"}
DICT_FIELDS = ("env_config", "sampler_config", "val_env_config", "model_override_config")
VERL_GPUS_PER_NODE, VERL_NNODES = 8, 1  # verl's defaults


def flatten_verl(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested verl sections (``actor_rollout_ref: {rollout: {n: 5}}``) -> dotted keys."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and name.split(".")[0] in VERL_ROOTS and not is_grid(value):
            flat.update(flatten_verl(value, name + "."))
        else:
            flat[name] = value
    return flat


@functools.cache
def known_config_keys(algo: str) -> frozenset[str]:
    """Every attribute of the algorithm's fresh config, plus RLlib's special spellings (and
    GRPO's names of RLlib's evaluation fields)."""
    config = default_config(algo)
    aliases = set(EVALUATION_ALIASES) if algo == "GRPO" else set()
    return frozenset(set(vars(config)) | set(config.to_dict()) | RLLIB_SPECIAL_KEYS | aliases)


@functools.cache
def property_keys(algo: str) -> dict[str, str]:
    """Public properties stored in a private attribute (``model_config`` ->
    ``_model_config``), as RLlib's own `to_dict`/`update_from_dict` spell them."""
    config = default_config(algo)
    cls, attrs = type(config), vars(config)
    return {name: "_" + name for name in dir(cls)
            if isinstance(getattr(cls, name, None), property) and "_" + name in attrs}


def is_verl_key(key: str) -> bool:
    return ("." in key and key.split(".")[0] in VERL_ROOTS) or key in VERL_TOP_LEVEL


def has_verl_keys(raw: Mapping[str, Any]) -> bool:
    """Whether one source gives any of its keys in verl's names."""
    return any(is_verl_key(key) for key in flatten_verl(raw))


@dataclasses.dataclass
class Translated:
    """One source's keys in canonical form."""

    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    run: dict[str, Any] = dataclasses.field(default_factory=dict)
    ignored: list[str] = dataclasses.field(default_factory=list)
    mapped: list[str] = dataclasses.field(default_factory=list)
    origin: dict[str, str] = dataclasses.field(default_factory=dict)
    recorded: dict[str, Any] = dataclasses.field(default_factory=dict)
    must_match: dict[str, Any] = dataclasses.field(default_factory=dict)
    custom_reward: dict[str, Any] = dataclasses.field(default_factory=dict)


def translate(raw: Mapping[str, Any], algo: str, source: str) -> Translated:
    """Check every key of one source and translate verl's names to ours.

    A verl name in `VERL_ALIASES` (a real mapping) wins over the tables here.
    """
    out = Translated()
    known = known_config_keys(algo)
    for key, value in flatten_verl(raw).items():
        if is_verl_key(key) and algo != "GRPO":
            raise ConfigError(f"{source}: verl key {key!r} only applies to --algo GRPO")
        name = VERL_ALIASES.get(key, key)
        if is_dtype_setting(name):  # verl spells dtypes bf16 / fp32
            value = canonical_dtype(value)
        if key in VERL_ALIASES:
            _set(out, name, check_type(key, name, value), key, source)
        elif is_verl_key(key):
            _translate_verl_key(out, key, value, known, source)
        elif algo == "GRPO" and key in DERIVED_FIELDS:
            raise ConfigError(f"{source}: {derived_field_error(key)}")
        elif key in known:
            _set(out, key, check_type(key, key, value), key, source)
        elif key in property_keys(algo):
            _set(out, property_keys(algo)[key], value, key, source)
        else:
            raise ConfigError(f"{source}: unknown config key {key!r} for {algo}."
                              + did_you_mean(key, [*known, *VERL_ALIASES]))
    _resources_from_verl(out, source)
    return out


def _translate_verl_key(out: Translated, key: str, value: Any, known: frozenset[str],
                        source: str) -> None:
    refused = prefix_match(key, VERL_REFUSED_PREFIXES)
    if refused or (key in VERL_REFUSED_LAYOUTS and value not in VERL_REFUSED_LAYOUTS[key][0]):
        why, nearest = (VERL_REFUSED_PREFIXES[refused] if refused
                        else VERL_REFUSED_LAYOUTS[key][1:])
        raise ConfigError(f"{source}: verl key {key}={value!r} is refused: {why}. "
                          f"Nearest setting that runs: {nearest}.")
    dict_prefix = prefix_match(key, VERL_PREFIX_TO_DICT)
    custom = next((p for p in VERL_CUSTOM_REWARD_PREFIXES if key.startswith(p)), None)
    entry = key[len(custom):] if custom else ""
    if custom and entry.partition(".")[0] in VERL_CUSTOM_REWARD_ENTRIES:
        out.custom_reward[entry] = value  # resolved once all sources are merged (build.py)
    elif key in VERL_IGNORED or key in VERL_REFUSED_LAYOUTS or prefix_match(
            key, VERL_IGNORED_PREFIXES):
        out.ignored.append(key)
    elif key in VERL_IGNORED_AT:
        _ignore_at(out, key, value, source)
    elif key in VERL_TO_RUN:
        out.run[key] = value
    elif key in VERL_RECORDED:
        if key == "reward_model.reward_manager" and value not in REWARD_MANAGERS:
            raise ConfigError(f"{source}: verl key {key}={value!r} has no rllib-grpo equivalent "
                              f"yet (use one of {', '.join(REWARD_MANAGERS)}, or register a "
                              "reward function: rllib_grpo.rewards.register_reward_fn)")
        out.recorded[key] = value
    elif key in VERL_MUST_MATCH:
        out.must_match[key] = value
    elif key in VERL_TO_SUB_KEY and VERL_TO_SUB_KEY[key][0] in known:
        field, entry = VERL_TO_SUB_KEY[key]
        _set(out, field, {entry: canonical_dtype(value) if entry == "dtype" else value}, key,
             source)
        out.mapped.append(f"{key} -> {field}.{entry}")
    elif dict_prefix:
        field, entry = VERL_PREFIX_TO_DICT[dict_prefix], key[len(dict_prefix):]
        _set(out, field, {entry: value}, key, source)
        out.mapped.append(f"{key} -> {field}.{entry}")
    else:
        raise ConfigError(f"{source}: verl key {key!r} has no rllib-grpo equivalent yet."
                          + did_you_mean(key, known_verl_keys()))


def _ignore_at(out: Translated, key: str, value: Any, source: str) -> None:
    expected, why = VERL_IGNORED_AT[key]
    if key.endswith("_dtype"):
        value = canonical_dtype(value)
    if value not in (expected if isinstance(expected, tuple) else (expected,)):
        raise ConfigError(f"{source}: verl key {key!r}={value!r} has no rllib-grpo equivalent "
                          f"yet (only {expected!r} is accepted: {why})")
    out.ignored.append(key)


def _set(out: Translated, name: str, value: Any, key: str, source: str) -> None:
    """Set one canonical field; two spellings of it in one source must agree (dict fields
    such as env_config merge entry by entry)."""
    current = out.config.get(name)
    if name in DICT_FIELDS and isinstance(value, Mapping) and isinstance(current, Mapping):
        for entry, item in value.items():
            if entry in current and current[entry] != item:
                raise ConfigError(f"{source}: {key!r} sets {name}.{entry}={item!r} but it is "
                                  f"already {current[entry]!r}")
        out.config[name] = {**current, **value}
        return
    if name in out.config and out.origin[name] != key and current != value:
        raise ConfigError(f"{source}: {key!r} and {out.origin[name]!r} both set {name} "
                          f"({value!r} vs {current!r})")
    out.config[name] = value
    out.origin[name] = key


def _resources_from_verl(out: Translated, source: str) -> None:
    """verl's GPUs (``trainer.n_gpus_per_node`` x ``trainer.nnodes``) with its rollout TP:
    verl's colocated layout (`layout.colocated_layout`), one learner per GPU and GPUs / TP
    engines on the same GPUs, asleep during the update."""
    gpus, nodes = (out.run.pop(k, None) for k in ("trainer.n_gpus_per_node", "trainer.nnodes"))
    if gpus is None and nodes is None:
        return
    total = int(VERL_GPUS_PER_NODE if gpus is None else gpus) * int(
        VERL_NNODES if nodes is None else nodes)
    if not total:  # no GPUs: the learner and the sampler in the driver, on CPUs
        _set(out, "num_learners", 0, "trainer.n_gpus_per_node", source)
        _set(out, "num_gpus_per_learner", 0, "trainer.n_gpus_per_node", source)
        out.mapped.append("trainer.n_gpus_per_node x trainer.nnodes = 0 -> num_learners=0 (CPU)")
        return
    tp = int(dict(out.config.get("sampler_config") or {}).get("tensor_parallel_size", 1) or 1)
    try:
        layout = colocated_layout(total, tp)
    except ValueError as error:
        raise ConfigError(f"{source}: verl keys trainer.n_gpus_per_node x trainer.nnodes and "
                          f"actor_rollout_ref.rollout.tensor_model_parallel_size: {error}") from None
    settings = {**layout.settings(),
                "gpus_per_node": int(VERL_GPUS_PER_NODE if gpus is None else gpus),
                "num_nodes": int(VERL_NNODES if nodes is None else nodes)}
    for name, value in settings.items():
        _set(out, name, value, "trainer.n_gpus_per_node", source)
    out.mapped.append("trainer.n_gpus_per_node x trainer.nnodes, rollout TP -> verl's colocated "
                      "layout: " + ", ".join(f"{k}={v}" for k, v in settings.items()))


_TYPE_CHECKS = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "float": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "dict": lambda v: isinstance(v, Mapping),
    "tuple": lambda v: isinstance(v, list | tuple),
    "list": lambda v: isinstance(v, list | tuple),
    "None": lambda v: v is None,
}


def is_grid(value: Any) -> bool:
    """A Tune grid search, ``{"grid_search": [...]}`` (classic experiment files use it)."""
    return isinstance(value, Mapping) and set(value) == {"grid_search"} and isinstance(
        value["grid_search"], list)


def check_type(key: str, name: str, value: Any) -> Any:
    """Check a GRPO setting's value against its declared type (lists become tuples).

    A grid search is checked point by point.
    """
    field = SETTINGS_FIELDS.get(name)
    alias = EVALUATION_ALIASES.get(name)
    if is_grid(value):
        return {"grid_search": [check_type(key, name, v) for v in value["grid_search"]]}
    declared = field.type if field is not None else alias.type if alias is not None else None
    if declared is None:
        return value
    allowed = [t.strip() for t in str(declared).split("|")]
    if not any(_TYPE_CHECKS.get(t, lambda v: True)(value) for t in allowed):
        raise ConfigError(f"{key}={value!r}: expected {' or '.join(allowed)}")
    return tuple(value) if "tuple" in allowed and isinstance(value, list) else value
