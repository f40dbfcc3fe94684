"""Reward specs: what each entry of TRL-style ``reward_funcs=[...]`` names.

An entry is

* ``None`` or ``"env"``: the env's own reward (``env_config.reward_fn``, else each row's
  ``data_source``; the per-``data_source`` choice of `rllib_grpo.rewards.compute_score`);
* a callable, ``"module:function"``, ``"file.py:function"`` or a registered scorer name
  (``"gsm8k"``): a rule function, run by a `RewardScorer` in the env runner;
* ``"http://..."`` / ``"https://..."``: a remote reward in OpenRLHF's protocol
  (`rllib_grpo.rewards.remote.RemoteReward`);
* any other string: a reward model, as in TRL (a folder, a built-in name or a cached hub
  id of a sequence-classification model), on the reward actors;
* a dict with ``type``: ``{"type": "model", "path": ...}``, ``{"type": "judge", "model":
  ..., "template": ..., "parse": "range" | "yes", "range": [0, 10]}`` (on the reward
  actors), ``{"type": "judge", "url": ..., "model": ...}`` (an OpenAI-compatible server),
  ``{"type": "remote", "url": ...}``, ``{"type": "function", "fn": ...}``; ``name`` and
  ``weight`` are accepted in every dict.

`parse_reward_specs` turns the list and ``reward_weights`` into `RewardSpec` s (names
unique: they key the ``reward/<name>/mean`` metrics).  No Ray, no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rllib_grpo.rewards.reward_registry import get_scorer

REWARD_KINDS = ("function", "model", "judge", "remote")
ENV_REWARD = "env"
_DICT_KEYS = {"function": ("fn",), "model": ("path",), "judge": ("model",),
              "remote": ("url",)}


@dataclass(frozen=True)
class RewardSpec:
    """One reward of a mixture.

    ``source`` is the function spec (None: the env's own), the model path, the judge's
    model (path, or the served name with ``options["url"]``) or the remote URL."""

    name: str
    kind: str
    weight: float = 1.0
    source: Any = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def on_actors(self) -> bool:
        """Runs on the reward actors (a reward model or a local judge)."""
        return self.kind == "model" or (self.kind == "judge" and not self.options.get("url"))

    @property
    def url(self) -> str | None:
        """The endpoint of a remote reward or a served judge."""
        return self.source if self.kind == "remote" else self.options.get("url")


def _is_scorer_name(text: str) -> bool:
    try:
        get_scorer(text)
    except ValueError:
        return False
    return True


def _default_name(kind: str, source: Any) -> str:
    if kind == "function":
        if source is None:
            return ENV_REWARD
        if callable(source):
            return getattr(source, "__name__", "function")
        return str(source).rpartition(":")[2] or str(source)
    if kind == "remote":
        return "remote"
    return Path(str(source).rstrip("/")).name.replace(":", "_") or kind


def spec_of(entry: Any, weight: float = 1.0) -> RewardSpec:
    """The `RewardSpec` of one ``reward_funcs`` entry (module docstring); ValueError for an
    entry of no known form."""
    if entry is None or entry == ENV_REWARD:
        return RewardSpec(ENV_REWARD, "function", weight, None)
    if callable(entry):
        return RewardSpec(_default_name("function", entry), "function", weight, entry)
    if isinstance(entry, str):
        if entry.startswith(("http://", "https://")):
            return RewardSpec("remote", "remote", weight, entry)
        if ":" in entry and not entry.startswith("builtin:") or _is_scorer_name(entry):
            return RewardSpec(_default_name("function", entry), "function", weight, entry)
        return RewardSpec(_default_name("model", entry), "model", weight, entry)
    if isinstance(entry, dict):
        options = dict(entry)
        kind = options.pop("type", None)
        if kind not in REWARD_KINDS:
            raise ValueError(f"reward_funcs entry {entry!r}: 'type' must be one of "
                             f"{', '.join(REWARD_KINDS)}")
        (key,) = _DICT_KEYS[kind]
        if kind != "function" and not options.get(key):
            raise ValueError(f"reward_funcs entry {entry!r}: a {kind} reward needs {key!r}")
        source = options.pop(key, None)
        weight = float(options.pop("weight", weight))
        name = options.pop("name", None) or (
            "judge" if kind == "judge" else _default_name(kind, source))
        return RewardSpec(str(name), kind, weight, source, options)
    raise ValueError(f"reward_funcs entry {entry!r}: use None, a function, a string or a dict "
                     "with 'type'")


def parse_reward_specs(reward_funcs: Sequence[Any] | Any,
                       reward_weights: Sequence[float] | None = None) -> list[RewardSpec]:
    """`spec_of` every entry, with its weight (``reward_weights`` in order, default 1;
    a dict's own ``weight`` wins), names made unique (``name``, ``name_2``, ...)."""
    entries = list(reward_funcs) if isinstance(reward_funcs, list | tuple) else [reward_funcs]
    if not entries:
        raise ValueError("reward_funcs is empty: give at least one reward (or None for the "
                         "env's own)")
    if reward_weights is not None and len(reward_weights) != len(entries):
        raise ValueError(f"reward_weights has {len(reward_weights)} weights for "
                         f"{len(entries)} reward_funcs: give one weight per reward")
    weights = [float(w) for w in reward_weights] if reward_weights is not None else [1.0] * len(
        entries)
    specs: list[RewardSpec] = []
    seen: dict[str, int] = {}
    for entry, weight in zip(entries, weights, strict=True):
        spec = spec_of(entry, weight)
        count = seen[spec.name] = seen.get(spec.name, 0) + 1
        if count > 1:
            spec = RewardSpec(f"{spec.name}_{count}", spec.kind, spec.weight, spec.source,
                              spec.options)
        specs.append(spec)
    return specs
