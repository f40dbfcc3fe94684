"""What runs in each learner actor (a Ray Train worker): `GRPOLearner` and its FSDP2 variant,
the learner group, the causal-LM RLModule, micro-batches, perf metrics, the rollout gap and
the sender side of a weight sync."""

from __future__ import annotations

from typing import Any

_EXPORTS = {"GRPOLearner": "rllib_grpo.rllib.learner.learner",
            "FSDPGRPOLearner": "rllib_grpo.rllib.learner.fsdp",
            "GRPOLearnerGroup": "rllib_grpo.rllib.learner.learner_group",
            "CausalLMRLModule": "rllib_grpo.rllib.learner.module"}


def __getattr__(name: str) -> Any:
    # Lazy, so that importing one module of this folder imports no other (and no Ray).
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
