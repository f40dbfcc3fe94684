"""rllib-grpo: GRPO fine-tuning of language models as a first-class Ray RLlib algorithm.

``import rllib_grpo`` registers the built-in text environments with gymnasium without
importing Ray or transformers.  Importing the algorithm (``from rllib_grpo import GRPO``)
registers ``"GRPO"`` with Ray Tune, as RLlib's own algorithms do; `register` does it
explicitly.  ``GRPO`` and ``GRPOConfig`` are imported
lazily, so ``import rllib_grpo.algos`` stays free of Ray and transformers.

Layers (lower never imports higher): ``algos`` (math) -> ``data``, ``rewards``, ``envs``
-> ``models``, ``samplers`` -> ``rllib`` (RLlib glue) -> ``cli`` (entry points) -> ``demo``.
"""

from __future__ import annotations

from typing import Any

from rllib_grpo import logs as _logs

__version__ = "0.1.0"

_LAZY = {
    "GRPO": "rllib_grpo.rllib.algorithm.grpo",
    "GRPOConfig": "rllib_grpo.rllib.config.grpo_config",
    "init_local_ray": "rllib_grpo.rllib.algorithm.local_ray",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module = importlib.import_module(_LAZY[name])
        return getattr(module, name)
    raise AttributeError(f"module 'rllib_grpo' has no attribute {name!r}")


def register() -> None:
    """Register ``"GRPO"`` with Ray Tune (idempotent), so that ``tune.Tuner("GRPO", ...)``
    and ``rllib train --algo GRPO`` find it; importing the algorithm does the same."""
    from rllib_grpo.rllib.algorithm.grpo import register as register_grpo

    register_grpo()


def _register_envs() -> None:
    try:
        from rllib_grpo.envs import register_envs
    except ImportError:  # pragma: no cover - envs package is part of the distribution
        return
    register_envs()


_register_envs()
# In a Ray worker started by a quiet console (`rllib_grpo.logs`), hide the same noise.
_logs.apply_from_env()
