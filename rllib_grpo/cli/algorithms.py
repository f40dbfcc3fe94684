"""Algorithm names on the command line: GRPO and RLlib's built-ins, resolved through Tune."""

from __future__ import annotations

import warnings
from typing import Any

from rllib_grpo.cli.errors import ConfigError


def known_algorithms() -> list[str]:
    """GRPO and RLlib's built-in algorithm names."""
    from ray.rllib.algorithms.registry import ALGORITHMS

    return ["GRPO", *sorted(ALGORITHMS)]


def resolve_algo(name: str) -> Any:
    """The Algorithm class Tune knows under ``name`` (GRPO or an RLlib built-in)."""
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.tune.registry import get_trainable_cls

    import rllib_grpo.rllib.algorithm.grpo  # noqa: F401  (registers "GRPO" with Tune)

    try:
        with warnings.catch_warnings():  # registering RLlib's built-ins warns about gym spaces
            warnings.simplefilter("ignore")
            cls = get_trainable_cls(name)
    except Exception as err:  # TuneError, or a built-in's import error
        raise ConfigError(f"--algo {name!r}: unknown algorithm ({err}); known: "
                          f"{', '.join(known_algorithms())}") from None
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise ConfigError(f"--algo {name!r} is a Tune trainable but not an RLlib Algorithm")
    return cls


def default_config(algo: str) -> Any:
    """A fresh default config of the algorithm."""
    if algo == "GRPO":
        from rllib_grpo.rllib.config.grpo_config import GRPOConfig

        return GRPOConfig()
    return resolve_algo(algo).get_default_config()
