"""Hugging Face weight naming shared by the samplers and LoRA: modules of a state-dict key,
and the sibling projections vLLM fuses into one parameter (so they must travel together)."""

from __future__ import annotations

# Projections vLLM loads into one fused parameter: a sync must carry all of a group or none.
FUSED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def module_of(key: str) -> str:
    """``model.layers.0.self_attn.q_proj.weight`` -> ``model.layers.0.self_attn.q_proj``."""
    return key.rpartition(".")[0]


def fused_closure(modules: set[str]) -> set[str]:
    """``modules`` plus their fused siblings (``...q_proj`` brings ``...k_proj``, ``...v_proj``)."""
    out = set(modules)
    for name in modules:
        parent, _, leaf = name.rpartition(".")
        for group in FUSED_GROUPS:
            if leaf in group:
                out |= {f"{parent}.{sibling}" if parent else sibling for sibling in group}
    return out
