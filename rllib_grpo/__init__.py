"""rllib-grpo: GRPO fine-tuning of language models as a first-class Ray RLlib algorithm.

``import rllib_grpo`` registers the built-in text environments with gymnasium
(cheap: no Ray, no transformers).  ``GRPO`` and ``GRPOConfig`` are imported
lazily; importing them (or ``rllib_grpo.algorithm``) registers ``"GRPO"`` with
Ray Tune.  When Ray is already imported, ``import rllib_grpo`` registers it at
once.  Lazy imports keep ``import rllib_grpo.algos`` free of Ray and
transformers.
"""

from __future__ import annotations

import sys
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "GRPO": "rllib_grpo.algorithm",
    "GRPOConfig": "rllib_grpo.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return getattr(module, name)
    raise AttributeError(f"module 'rllib_grpo' has no attribute {name!r}")


def register() -> None:
    """Register ``"GRPO"`` with Ray Tune (idempotent)."""
    from rllib_grpo.algorithm import register_grpo

    register_grpo()


def _register_envs() -> None:
    try:
        from rllib_grpo.envs import register_envs
    except ImportError:  # pragma: no cover - envs package is part of the distribution
        return
    register_envs()


_register_envs()

if "ray.tune" in sys.modules:  # Ray is loaded anyway: registering costs nothing extra
    register()
