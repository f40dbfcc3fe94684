"""Where a config is built (the user's process, the driver, every actor that reads one):
`settings` (the one table of fields), `grpo_config.GRPOConfig`, `checks` (every error and
pitfall, typed with the settings class), `explain`, `memory` (the estimate) and `staleness`
(the async knob's checks).  ``from rllib_grpo.rllib.config import GRPOConfig`` keeps working."""

from __future__ import annotations

from typing import Any

_EXPORTS = {"GRPOConfig": "rllib_grpo.rllib.config.grpo_config", "TEXT_SPACE": "rllib_grpo.rllib.config.grpo_config",
            "BatchPlan": "rllib_grpo.rllib.config.settings"}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing one module of this folder imports no other (and no Ray).
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
