"""What both benchmark runs share: the workload, the phase names, timing and memory helpers."""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import io
import os
import pstats
import resource
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The phases of one iteration, in order, with the names verl's timing_s/* metrics use.
PHASES = ("generation", "reward", "old_log_prob", "ref", "adv", "update", "weight_sync",
          "driver_overhead")
VERL_NAMES = {
    "generation": "gen", "reward": "reward", "old_log_prob": "old_log_prob", "ref": "ref",
    "adv": "adv", "update": "update_actor (fwd+bwd+step)", "weight_sync": "update_weights",
    "driver_overhead": "-",
}
# Parts of the RLlib run's driver overhead (they sum to it).
OVERHEAD_PARTS = ("sampling_other", "learner_other", "step_other", "train_other")
OVERHEAD_DOCS = {
    "sampling_other": "env runner outside generate/score: prompt resets, padding, metrics",
    "learner_other": "learner outside the compute: batch conversion, RLlib update loop, metrics",
    "step_other": "training_step rest: data metrics, learner metric surfacing",
    "train_other": "Algorithm.train outside training_step: result dict, metric reduction",
}


@dataclasses.dataclass
class Workload:
    """One benchmark workload: the model, the batch, and how long to measure."""

    model: str = "builtin:tiny"
    model_dir: str = ""
    prompts: int = 8
    group_size: int = 4
    response_length: int = 32
    max_prompt_length: int = 64
    max_operand: int = 9
    iterations: int = 5
    warmup: int = 1
    sampler: str = "hf"
    kl: bool = True
    micro_batch_size: int | None = None
    threads: int = 1
    seed: int = 0
    lr: float = 1e-6
    device: str = "cpu"
    dtype: str = "float32"
    fixed_length: bool = True
    # The RLlib run's learner: padding-free rows (use_remove_padding) and the on-policy
    # shortcut (skip_old_log_prob_pass), the package's defaults; the plain loop is padded.
    remove_padding: bool = True
    old_log_prob_pass: bool = False
    profile_dir: str | None = None
    # Proposed framework changes tried by patching at run time (see benchmarks.rllib_run).
    experiments: list[str] = dataclasses.field(default_factory=list)

    @property
    def trajectories(self) -> int:
        """Responses per iteration."""
        return self.prompts * self.group_size

    def engine_options(self) -> dict[str, Any]:
        """Sampler options for this device (same in both runs)."""
        if self.device == "cpu":
            return {}
        if self.sampler == "hf":
            return {"device": self.device}
        return {"gpu_memory_utilization": 0.3}

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Workload:
        return cls(**data)


class Timer:
    """Accumulates seconds per phase; synchronises CUDA before each reading."""

    def __init__(self, device: str = "cpu") -> None:
        self.totals: dict[str, float] = {}
        self.cuda = device.startswith("cuda")

    def now(self) -> float:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.add(name, self.now() - start)

    def add(self, name: str, seconds: float) -> None:
        self.totals[name] = self.totals.get(name, 0.0) + seconds

    def get(self, name: str) -> float:
        return self.totals.get(name, 0.0)

    def reset(self) -> None:
        self.totals = {}


def token_counts(prompt_lengths: Any, response_lengths: Any, prompt_width: int,
                 response_width: int) -> dict[str, float]:
    """Real and padded token counts of one batch."""
    rows = len(response_lengths)
    prompt_tokens, response_tokens = float(sum(prompt_lengths)), float(sum(response_lengths))
    return {
        "prompt_tokens": prompt_tokens,
        "response_tokens": response_tokens,
        "tokens": prompt_tokens + response_tokens,
        "padded_tokens": float(rows * (prompt_width + response_width)),
        "mean_response_length": response_tokens / max(rows, 1),
    }


def peak_memory_mb() -> dict[str, float]:
    """This process's peak RSS and, on a GPU, torch's peak allocation (MiB)."""
    out = {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            out["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


def cpu_seconds(include_children: bool = False) -> dict[str, float]:
    """CPU seconds used so far by this process and, optionally, its child processes."""
    import psutil

    me = psutil.Process()
    times = me.cpu_times()
    out = {"driver_cpu_s": times.user + times.system}
    if include_children:
        total = 0.0
        for child in me.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
        out["ray_processes_cpu_s"] = total
    return out


def cpu_per_iteration(before: dict[str, float], after: dict[str, float],
                      iterations: int) -> dict[str, float]:
    """CPU seconds per measured iteration, per entry of `cpu_seconds`."""
    return {f"{k}_per_iteration": (after[k] - before[k]) / max(iterations, 1) for k in before}


def mean_record(records: list[dict[str, float]]) -> dict[str, float]:
    """Key-wise mean of the per-iteration records."""
    keys = records[0].keys() if records else ()
    return {k: sum(r[k] for r in records) / len(records) for k in keys}


@contextlib.contextmanager
def maybe_profiled(profile_dir: str | None, name: str) -> Iterator[None]:
    """cProfile the block into ``profile_dir/name.prof`` and ``name_top.txt`` when asked."""
    if not profile_dir:
        yield
        return
    profiler = cProfile.Profile()
    profiler.enable()
    try:
        yield
    finally:
        profiler.disable()
        folder = Path(profile_dir)
        folder.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(str(folder / f"{name}.prof"))
        (folder / f"{name}_top.txt").write_text(profile_summary(profiler))


def profile_summary(profiler: cProfile.Profile, limit: int = 40) -> str:
    """The top functions by own time and by cumulative time, as text."""
    out = io.StringIO()
    for key in ("tottime", "cumulative"):
        stats = pstats.Stats(profiler, stream=out)
        stats.strip_dirs().sort_stats(key).print_stats(limit)
    return out.getvalue()


def load_average() -> float:
    """The 1-minute load average (how busy the machine was)."""
    return os.getloadavg()[0]
