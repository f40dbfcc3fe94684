"""The driver: the `GRPO` algorithm, its sampling strategies, resilience (retried steps,
complete checkpoints), checkpoint files and the driver's side of a weight sync."""

from __future__ import annotations

from typing import Any

_EXPORTS = {"GRPO": "rllib_grpo.rllib.algorithm.grpo"}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing one module of this folder imports no other (and no Ray).
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
