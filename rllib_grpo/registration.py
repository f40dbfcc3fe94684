"""Make ``"GRPO"`` resolvable by Ray Tune after ``import rllib_grpo``, in any import order,
without importing Ray (``import rllib_grpo.algos`` must stay free of Ray and transformers).

Tune resolves a trainable name through ``ray.tune.registry._has_trainable``.  When that
module is loaded (now, or later through a post-import hook on ``sys.meta_path``), its
``_has_trainable`` is wrapped so that the first lookup of a name in `LAZY_TRAINABLES`
imports the algorithm and registers it.  At lookup time Ray is fully imported, so the
algorithm's import cannot meet a half-initialised Ray package.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any

REGISTRY_MODULE = "ray.tune.registry"
# Tune name -> "module:class" (imported on first lookup).
LAZY_TRAINABLES = {"GRPO": "rllib_grpo.rllib.algorithm.grpo:GRPO"}


def trainable_class(name: str) -> Any:
    """The class of the lazy trainable ``name`` (`LAZY_TRAINABLES`), imported by name."""
    module, _, attribute = LAZY_TRAINABLES[name].partition(":")
    return getattr(importlib.import_module(module), attribute)


def register_now(name: str) -> None:
    """Register the lazy trainable ``name`` with Tune (idempotent)."""
    from ray.tune.registry import register_trainable

    register_trainable(name, trainable_class(name))


def _wrap_registry(registry: Any) -> None:
    original: Callable[[str], bool] = registry._has_trainable
    if getattr(original, "_rllib_grpo_lazy", False):
        return

    def _has_trainable(trainable_name: str) -> bool:
        if original(trainable_name):
            return True
        if trainable_name in LAZY_TRAINABLES:
            register_now(trainable_name)
            return original(trainable_name)
        return False

    _has_trainable._rllib_grpo_lazy = True  # type: ignore[attr-defined]
    registry._has_trainable = _has_trainable


class _WrappingLoader:
    """The real loader of ``ray.tune.registry``, plus `_wrap_registry` right after the module's
    body ran, before anyone reads ``get_trainable_cls`` from it."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        _wrap_registry(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, ...: the real loader's
        return getattr(self._loader, name)


class _RegistryHook(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands ``ray.tune.registry``'s own spec a `_WrappingLoader`."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != REGISTRY_MODULE:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _WrappingLoader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


def install() -> None:
    """Wrap Tune's registry now if it is loaded, else when it is first imported."""
    if REGISTRY_MODULE in sys.modules:
        _wrap_registry(sys.modules[REGISTRY_MODULE])
    elif not any(isinstance(f, _RegistryHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _RegistryHook())
