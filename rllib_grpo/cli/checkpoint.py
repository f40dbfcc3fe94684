"""Read a GRPO checkpoint's policy from its files: no Ray cluster, no import of Ray.

An algorithm checkpoint (``algo.save_to_path``, a Tune ``checkpoint_00000k``) keeps
the policy in RLlib's learner layout::

    rllib_checkpoint.json  class_and_ctor_args.pkl (the algorithm config, as a dict)
    learner_group/learner/rl_module/default_policy/
        module_state.pkl          the full HF state dict (FSDP shards already gathered,
                                  whatever the number of learners) or a LoRA adapter
        class_and_ctor_args.pkl   the module's model_config (model path, dtype, lora_*)

`read_checkpoint` accepts that folder or any folder on the way down to the module
(``learner_group``, ``learner``, ``rl_module``, ``default_policy``).  The pickles
name RLlib's and this package's classes; they are read with those classes replaced
by inert stand-ins (`_InertUnpickler`), so reading needs neither Ray nor the
versions that wrote them.  Pickle runs code from the file all the same: read only
checkpoints you trust, as for ``Algorithm.from_checkpoint``.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_MODULE_ID = "default_policy"  # ray.rllib.core.DEFAULT_MODULE_ID, without importing Ray
MODULE_PATH = ("learner_group", "learner", "rl_module", DEFAULT_MODULE_ID)
STATE_FILE, CTOR_FILE = "module_state.pkl", "class_and_ctor_args.pkl"
# Modules whose classes a checkpoint's pickles may build for real: tensors, arrays, containers.
_REAL_MODULES = ("torch", "numpy", "collections", "copyreg", "_codecs", "datetime", "pathlib")
_REAL_BUILTINS = {"set", "frozenset", "slice", "range", "complex", "bytearray", "tuple", "list",
                  "dict", "int", "float", "str", "bytes", "bool", "object"}


class CheckpointError(ValueError):
    """Not a readable GRPO checkpoint (the message says why and what was expected)."""


@dataclass
class Checkpoint:
    """A checkpoint's policy module and the settings it was trained with."""

    path: Path
    module_dir: Path
    model_config: dict[str, Any]
    algorithm_config: dict[str, Any] | None

    @property
    def base_model(self) -> str:
        """The run's ``model_path`` (folder, hub id or built-in name)."""
        return str(self.model_config["model"])

    @property
    def model_dtype(self) -> str:
        return str(self.model_config.get("dtype", "float32"))

    @property
    def is_lora(self) -> bool:
        return int(self.model_config.get("lora_rank") or 0) > 0

    def setting(self, name: str, default: Any = None) -> Any:
        """A field of the algorithm config (``env``, ``max_response_length``, ...)."""
        return (self.algorithm_config or {}).get(name, default)

    def load_module_state(self) -> dict[str, Any]:
        """The module state: a full HF state dict, or a LoRA adapter checkpoint."""
        state = _read_pickle(self.module_dir / STATE_FILE)
        if not isinstance(state, Mapping) or not state:
            raise CheckpointError(f"{self.module_dir / STATE_FILE} holds no weights "
                                  f"(a {type(state).__name__})")
        return dict(state)


def find_module_dir(path: str | Path) -> Path | None:
    """The policy module's folder inside ``path`` (itself or below it), or None."""
    path = Path(path)
    for depth in range(len(MODULE_PATH) + 1):
        candidate = path.joinpath(*MODULE_PATH[depth:])
        if (candidate / CTOR_FILE).is_file() and _has_state(candidate):
            return candidate
    return None


def is_checkpoint(path: str | Path) -> bool:
    """True for a folder `read_checkpoint` can read."""
    return Path(path).is_dir() and find_module_dir(path) is not None


def read_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """The policy module of an algorithm checkpoint (or of a folder below one)."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise CheckpointError(f"{path}: no such checkpoint folder")
    module_dir = find_module_dir(path)
    if module_dir is None:
        inside = sorted(p for p in path.glob("checkpoint_*") if find_module_dir(p))
        hint = f"; a Tune trial folder? its latest checkpoint is {inside[-1]}" if inside else ""
        raise CheckpointError(f"{path}: not a GRPO checkpoint (no "
                              f"{'/'.join(MODULE_PATH)}/{STATE_FILE} below it){hint}")
    if not (module_dir / STATE_FILE).is_file():
        raise CheckpointError(f"{module_dir}: a msgpack checkpoint; export reads pickle "
                              "checkpoints (save without use_msgpack)")
    ctor = _read_pickle(module_dir / CTOR_FILE)
    try:
        model_config = dict(ctor["ctor_args_and_kwargs"][1]["model_config"])
        model_config["model"]
    except (KeyError, IndexError, TypeError):
        raise CheckpointError(f"{module_dir / CTOR_FILE}: no model_config with a 'model' "
                              "entry; not a GRPO (CausalLMRLModule) checkpoint") from None
    root = module_dir.parents[len(MODULE_PATH) - 1] if _is_below_root(module_dir) else None
    return Checkpoint(path, module_dir, model_config, _algorithm_config(root))


def _has_state(folder: Path) -> bool:
    return (folder / STATE_FILE).is_file() or (folder / "module_state.msgpack").is_file()


def _is_below_root(module_dir: Path) -> bool:
    return module_dir.parts[-len(MODULE_PATH):] == MODULE_PATH


def _algorithm_config(root: Path | None) -> dict[str, Any] | None:
    """The algorithm's config (``Algorithm`` checkpoints pickle it as a dict), if there."""
    if root is None or not (root / CTOR_FILE).is_file():
        return None
    try:
        ctor = _read_pickle(root / CTOR_FILE)
        args, kwargs = ctor["ctor_args_and_kwargs"]
        config = kwargs.get("config", args[0] if args else None)
    except (CheckpointError, KeyError, IndexError, TypeError, ValueError):
        return None
    return dict(config) if isinstance(config, Mapping) else None


def _read_pickle(path: Path) -> Any:
    try:
        with open(path, "rb") as file:
            return _InertUnpickler(file).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as err:
        raise CheckpointError(f"{path}: unreadable ({type(err).__name__}: {err})") from None


class _Inert:
    """Stands in for a class the checkpoint names (an RLlib config class, a space, ...)."""

    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args, self.kwargs, self.state = args, kwargs, None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.qualname}>"


class _InertUnpickler(pickle.Unpickler):
    """Builds tensors, arrays and containers; any other class becomes an `_Inert`."""

    def find_class(self, module: str, name: str) -> Any:
        top = module.split(".")[0]
        if top in _REAL_MODULES or (module == "builtins" and name in _REAL_BUILTINS):
            return super().find_class(module, name)
        return type(name, (_Inert,), {"qualname": f"{module}.{name}"})
