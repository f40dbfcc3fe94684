"""Suite ``rollout_modes``: continuous rollouts against the synchronous loop and one step off
policy, on a long-tail workload, modes in turns in one run (docs/async.md).

    python -m benchmarks rollout_modes                         # 2 rounds x 5 modes x 90 s
    python -m benchmarks rollout_modes --seconds 60 --modes sync one_step_off --rounds 1

Workload: Arithmetic-v0 prompts, ``builtin:tiny`` (random weights, so its responses end at
a random EOS: lengths spread over 1-64 tokens, max_response_length=64), vLLM sampler, 8
prompts x 4 responses per step, reward = the share of digits in the response
(`digit_share`: a signal the tiny model can learn at any length).  One remote learner
(``num_learners=1``), two remote env runners.  Modes: ``sync`` (max_staleness=0),
``one_step_off`` (max_staleness=1), ``continuous_k1/k2/k4`` (rollout_mode='continuous',
max_staleness=1/2/4); every asynchronous mode with ``rollout_is='token'``.

Each mode builds a fresh algorithm (not timed), trains for a fixed wall time and reports
trajectories per minute, the mean ``async/learner_idle_frac`` and
``async/sampler_idle_frac``, the response lengths, and the reward per trajectory against
trajectories seen (mean ``critic/score/mean`` in bins of ``BIN`` trajectories).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

TITLE = "rollout modes: synchronous, one step off policy, continuous (K = 1, 2, 4)"
DESCRIPTION = """
`builtin:tiny` with vLLM, responses of 1-64 tokens (a long tail), reward = share of digits;
one remote learner, two remote env runners; each mode trains for a fixed time, modes in turns;
per-mode means. The reward is the mean score over the last 256 trajectories.
"""
PROMPTS, GROUP = 8, 4
BIN = 256  # trajectories per bin of the reward curve
ASYNC = {"rollout_is": "token"}
MODES: dict[str, dict[str, Any]] = {
    "sync": {"max_staleness": 0},
    "one_step_off": {"max_staleness": 1, **ASYNC},
    "continuous_k1": {"max_staleness": 1, "rollout_mode": "continuous", **ASYNC},
    "continuous_k2": {"max_staleness": 2, "rollout_mode": "continuous", **ASYNC},
    "continuous_k4": {"max_staleness": 4, "rollout_mode": "continuous", **ASYNC},
}


def digit_share(data_source: str, solution_str: str, ground_truth: Any,
                extra_info: dict | None = None) -> float:
    """The share of the response's characters that are digits (0 for an empty one)."""
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str) if solution_str else 0.0


def build(mode: str, seed: int = 0) -> Any:
    """The long-tail workload's config in ``mode`` (module docstring)."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    config = (GRPOConfig()
              .environment("rllib_grpo/Arithmetic-v0", env_config={
                  "max_operand": 4, "reward_fn": "benchmarks.rollout_modes:digit_share"})
              .training(model_path="builtin:tiny", prompts_per_step=PROMPTS, group_size=GROUP,
                        max_prompt_length=16, max_response_length=64, lr=1e-3,
                        sampler="vllm", **MODES[mode])
              .debugging(seed=seed))
    config.env_runners(num_env_runners=2, create_local_env_runner=False)
    config.learners(num_learners=1)
    return config.build_algo()


def run_for(algo: Any, seconds: float) -> dict[str, Any]:
    """Train for ``seconds`` of wall time (the iteration running at the end finishes)."""
    scores, lengths, learner_idle, sampler_idle, staleness = [], [], [], [], []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = algo.train()
        scores.append(float(result["critic/score/mean"]))
        lengths.append(float(result["response_length/mean"]))
        learner_idle.append(float(result["async/learner_idle_frac"]))
        sampler_idle.append(float(result["async/sampler_idle_frac"]))
        staleness.append(float(result.get("async/token_staleness_max",
                                          result.get("async/staleness_max", 0.0))))
    elapsed = time.perf_counter() - start
    per_step = PROMPTS * GROUP
    per_bin = max(1, BIN // per_step)
    curve = [statistics.fmean(scores[i:i + per_bin]) for i in range(0, len(scores), per_bin)]
    rollout = algo.last_rollout
    return {"iterations": len(scores), "seconds": elapsed,
            "trajectories_per_min": 60.0 * len(scores) * per_step / elapsed,
            "learner_idle_frac": statistics.fmean(learner_idle),
            "sampler_idle_frac": statistics.fmean(sampler_idle),
            "response_length_mean": statistics.fmean(lengths),
            "response_length_min": int(rollout.response_lengths.min()),
            "response_length_max": int(rollout.response_lengths.max()),
            "staleness_max": max(staleness), "reward_curve": curve}


def run_modes(seconds: float, modes: list[str]) -> list[dict[str, Any]]:
    rows = []
    for mode in modes:
        t0 = time.perf_counter()
        algo = build(mode)
        build_s = time.perf_counter() - t0
        try:
            rows.append({"mode": mode, "build_s": build_s, **run_for(algo, seconds)})
        finally:
            algo.stop()
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "reward_curve"}), flush=True)
    return rows


def mode_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The table: throughput and its ratios to sync / one_step_off, idle shares, lengths."""
    base = {r["mode"]: r["trajectories_per_min"] for r in rows}
    table = []
    for r in rows:
        tpm = r["trajectories_per_min"]
        table.append({
            "mode": r["mode"], "trajectories / min": tpm,
            "x sync": tpm / base["sync"] if base.get("sync") else None,
            "x one_step_off": tpm / base["one_step_off"] if base.get("one_step_off") else None,
            "learner idle": r["learner_idle_frac"], "sampler idle": r["sampler_idle_frac"],
            "response length": r["response_length_mean"], "max staleness": r["staleness_max"],
            "reward, last bin": r["reward_curve"][-1] if r["reward_curve"] else None,
            "trajectories seen": BIN * len(r["reward_curve"]),
        })
    return table


def mean_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-mode means over several runs (each a list of rows; modes in any order)."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for run_rows in runs:
        for run_row in run_rows:
            by_mode.setdefault(run_row["mode"], []).append(run_row)
    means = []
    for mode in (m for m in MODES if m in by_mode):
        rows = by_mode[mode]
        row: dict[str, Any] = {"mode": mode}
        for key in ("trajectories_per_min", "learner_idle_frac", "sampler_idle_frac",
                    "response_length_mean"):
            row[key] = statistics.fmean(r[key] for r in rows)
        row["staleness_max"] = max(r["staleness_max"] for r in rows)
        width = min(len(r["reward_curve"]) for r in rows)
        row["reward_curve"] = [statistics.fmean(r["reward_curve"][i] for r in rows)
                               for i in range(width)]
        means.append(row)
    return means


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Every mode for a fixed time, ``--rounds`` times in rotated orders; per-mode means."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks rollout_modes",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of every mode, each round in another order")
    args = parser.parse_args(argv)
    import ray

    load = os.getloadavg()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        runs = [run_modes(args.seconds, args.modes[i:] + args.modes[:i])
                for i in range(args.rounds)]
    finally:
        ray.shutdown()
    print(f"load average at start: {load[0]:.2f}; at end: {os.getloadavg()[0]:.2f}")
    return mode_rows(mean_rows(runs))
