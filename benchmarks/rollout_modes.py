"""Continuous rollouts against the synchronous loop and one step off policy, on a long-tail
workload, modes in turns in one run (docs/async.md, "Continuous rollouts: measured").

    python -m benchmarks.continuous_grpo                       # 5 modes x 90 s
    python -m benchmarks.continuous_grpo --seconds 60 --json benchmarks/results/continuous_grpo.json
    python -m benchmarks.continuous_grpo --modes continuous_k4 ... sync --json run2.json
    python -m benchmarks.continuous_grpo --combine run1.json run2.json   # per-mode means

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
                  "max_operand": 4, "reward_fn": "benchmarks.continuous_grpo:digit_share"})
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


def format_table(rows: list[dict[str, Any]]) -> str:
    """Throughput, idle shares and lengths per mode, and ratios to sync / one_step_off."""
    base = {r["mode"]: r["trajectories_per_min"] for r in rows}
    tokens = {r["mode"]: r["trajectories_per_min"] * r["response_length_mean"] for r in rows}
    lines = ["| mode | trajectories / min | x sync | x one_step_off | response tokens / min | "
             "x sync | learner idle | sampler idle | response length mean | max staleness |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        tpm = r["trajectories_per_min"]
        x_sync, x_off = (f"{tpm / base[m]:.2f}x" if base.get(m) else "-"
                         for m in ("sync", "one_step_off"))
        tok = tokens[r["mode"]]
        tok_sync = f"{tok / tokens['sync']:.2f}x" if tokens.get("sync") else "-"
        lines.append(f"| {r['mode']} | {tpm:.0f} | {x_sync} | {x_off} | {tok:.0f} | {tok_sync} | "
                     f"{r['learner_idle_frac']:.2f} | {r['sampler_idle_frac']:.2f} | "
                     f"{r['response_length_mean']:.1f} | {r['staleness_max']:g} |")
    lines += ["", f"Reward per trajectory (mean score) per {BIN} trajectories seen:", "",
              "| trajectories | " + " | ".join(r["mode"] for r in rows) + " |",
              "|---|" + "---|" * len(rows)]
    longest = max(len(r["reward_curve"]) for r in rows)
    for i in range(longest):
        cells = [f"{r['reward_curve'][i]:.3f}" if i < len(r["reward_curve"]) else ""
                 for r in rows]
        lines.append(f"| {i * BIN + 1}-{(i + 1) * BIN} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def mean_rows(runs: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per-mode means over several runs (each a list of rows; modes in any order)."""
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for rows in runs:
        for row in rows:
            by_mode.setdefault(row["mode"], []).append(row)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--json", default=None)
    parser.add_argument("--combine", nargs="+", default=None, metavar="JSON",
                        help="print the per-mode means of earlier --json runs, run nothing")
    args = parser.parse_args()
    if args.combine:
        runs = []
        for path in args.combine:
            with open(path) as file:
                runs.append(json.load(file)["rows"])
        print(format_table(mean_rows(runs)))
        return
    import ray

    load = os.getloadavg()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    rows = run_modes(args.seconds, args.modes)
    ray.shutdown()
    table = format_table(rows)
    print(f"load average at start: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; at end: "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(table)
    if args.json:
        with open(args.json, "w") as file:
            json.dump({"seconds": args.seconds, "load_start": load, "load_end": os.getloadavg(),
                       "rows": rows}, file, indent=1)


if __name__ == "__main__":
    main()
