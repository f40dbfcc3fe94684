"""What the learner logs per training step: `StepMetrics` (per-step means), value stats,
and its throughput under verl's names: phase timings, training tokens/s, model FLOPs
utilisation (``perf/mfu/actor``) and peak device memory.

MFU follows the usual estimate: a training token costs 6 x parameters FLOPs (forward 2,
backward 4) and an inference token (the old log-prob pass) 2 x parameters, divided by
the device's peak.  Only real tokens count (prompt + response, no padding), so padding
shows up as lost utilisation.  The peak of a known GPU comes from `PEAK_BF16_TFLOPS` by
device name (dense bf16, as verl's table); on a CPU or an unknown device there is no MFU.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

# Dense bf16 tensor-core peak (TFLOP/s) by a substring of torch.cuda.get_device_name();
# the first match wins, so the more specific names come first.  Hopper's PCIe and NVL
# boards run lower clocks and power than the SXM board (whose name carries no form factor:
# "NVIDIA H100 80GB HBM3"); A100 and A800 are 312 in both form factors.
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB200", 2500.0), ("B200", 2250.0),
    ("H200 NVL", 835.0), ("H200", 989.0),
    ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0),
    ("H800 PCIe", 756.0), ("H800", 989.0),
    ("H20", 148.0), ("A100", 312.0), ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0),
    ("L20", 119.5), ("L4", 121.0), ("A10", 125.0), ("RTX 4090", 165.0), ("RTX 3090", 71.0),
)


# verl's namespaces of the learner's metrics.  Every metric the learner logs (`StepMetrics`)
# is in one of them, and the algorithm surfaces the learner results in them at the top
# level of its result (`GRPO._surface_learner_metrics`): a new metric needs no list.
LEARNER_METRIC_NAMESPACES = (
    "actor/", "critic/", "training/", "rollout_corr/", "response/", "timing_s/", "perf/",
)


class StepMetrics:
    """Values logged during one training step, averaged per key when flushed (every
    mini-batch and micro-batch of the step adds to the same mean)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, key: str, value: float) -> None:
        if not key.startswith(LEARNER_METRIC_NAMESPACES):
            raise ValueError(f"Learner metric {key!r} is in none of LEARNER_METRIC_NAMESPACES "
                             f"{LEARNER_METRIC_NAMESPACES}: it would not reach the result.")
        self.values[key].append(float(value))

    def flush(self, logger: Any, module_id: str) -> None:
        """Log each key's mean to RLlib's metrics logger, then start over."""
        for key, values in self.values.items():
            logger.log_value((module_id, key), float(np.mean(values)), reduce="mean", window=1)
        self.values.clear()


def value_stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    """``{prefix}/mean``, ``/max`` and ``/min`` of ``values`` (nothing when empty)."""
    if values.numel() == 0:
        return {}
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


def critic_metrics(token_rewards: torch.Tensor, advantages: torch.Tensor,
                   returns: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """verl's ``critic/{rewards,advantages,returns}/{mean,max,min}``: the rewards summed per
    sequence (B,), the advantages and returns over the ``mask``'s tokens (all (B, R))."""
    valid = mask.bool()
    return {**value_stats("critic/rewards", token_rewards.sum(-1)),
            **value_stats("critic/advantages", advantages[valid]),
            **value_stats("critic/returns", returns[valid])}


def peak_flops(device: torch.device) -> float | None:
    """Peak FLOP/s of ``device``: the table's for a known GPU, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, tflops in PEAK_BF16_TFLOPS:
        if key in name:
            return tflops * 1e12
    return None


def num_parameters(module: torch.nn.Module) -> int:
    """Parameters of ``module``, frozen ones included (a sharded DTensor counts in full)."""
    return sum(p.numel() for p in module.parameters())


class PhaseTimes:
    """Wall time and real tokens per phase of one training step (CUDA synchronised at the
    edges, so asynchronous kernels count in the phase that launched them)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.seconds: dict[str, float] = defaultdict(float)
        self.tokens: dict[str, float] = defaultdict(float)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def phase(self, name: str, tokens: float = 0.0) -> Iterator[None]:
        """Add the duration of the ``with`` block (and ``tokens``) to phase ``name``."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self.seconds[name] += time.perf_counter() - start
            self.tokens[name] += tokens

    def reset(self) -> None:
        """Start a new training step (and, on CUDA, a new memory peak)."""
        self.seconds.clear()
        self.tokens.clear()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)


def step_metrics(times: PhaseTimes, params: int, peak: float | None) -> dict[str, float]:
    """verl-named metrics of one learner's step from its ``times`` (phases ``old_log_prob``,
    ``ref`` and ``update_policy``; tokens counted once per pass)."""
    out = {f"timing_s/{name}": seconds for name, seconds in times.seconds.items()}
    out.setdefault("timing_s/old_log_prob", 0.0)  # 0: the update's forward gave them
    update_s, update_tokens = times.seconds.get("update_policy", 0.0), times.tokens.get(
        "update_policy", 0.0)
    if update_s > 0:
        out["perf/actor_tokens_per_s"] = update_tokens / update_s
        if peak:
            out["perf/mfu/actor"] = 6.0 * params * update_tokens / update_s / peak
    infer_s = times.seconds.get("old_log_prob", 0.0)
    if infer_s > 0 and peak:
        out["perf/mfu/actor_infer"] = 2.0 * params * times.tokens["old_log_prob"] / infer_s / peak
    if times.device.type == "cuda":
        out["perf/max_memory_allocated_gb"] = torch.cuda.max_memory_allocated(times.device) / 2**30
        out["perf/max_memory_reserved_gb"] = torch.cuda.max_memory_reserved(times.device) / 2**30
    return out
