"""Asynchronous GRPO benchmark: synchronous (``max_staleness=0``) against one-step-off-policy
(``max_staleness=1`` with ``rollout_is='token'``) on the demo's workload, one remote env
runner and one remote learner process (``num_learners=1``), on CPU.

    python -m benchmarks.async_grpo                         # 2 rounds x 2 modes x 90 s
    python -m benchmarks.async_grpo --seconds 60 --rounds 1 --json out.json
    python -m benchmarks.async_grpo --curve 120                # reward per 20 iterations
    python -m benchmarks.async_grpo --lr 3e-4 ...              # the demo at another lr

Each run builds a fresh algorithm (the build is not timed), then trains for a fixed wall
time; it reports iterations per minute, the mean reward (``critic/score/mean``) of the
last 5 iterations of that time, and the means of ``async/learner_idle_frac`` and
``async/sampler_idle_frac`` (definitions in docs/async.md).  The modes take turns, the
order rotating every round, so both see the same load on a shared machine; the table
gives per-mode means over the rounds and the async / sync ratio.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from typing import Any

# name -> GRPO settings: one step off policy with its recommended correction (docs/async.md)
MODES: dict[str, dict[str, Any]] = {"sync": {"max_staleness": 0},
                                    "async": {"max_staleness": 1, "rollout_is": "token"}}
# --curve also runs one step off policy without the correction.
CURVE_MODES: dict[str, dict[str, Any]] = {**MODES, "async_no_is": {"max_staleness": 1}}
LAST = 5  # iterations whose reward is "the reward after the fixed wall time"


def build(mode: str, seed: int = 0, lr: float | None = None) -> Any:
    """The demo's config (``lr`` None: its own) with one remote env runner and one remote
    learner."""
    from rllib_grpo.demo.run_demo import demo_config

    config = demo_config(seed=seed, sampler="hf").training(**CURVE_MODES[mode])
    if lr is not None:
        config.training(lr=lr)
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    config.learners(num_learners=1)
    return config.build_algo()


def run_for(algo: Any, seconds: float) -> dict[str, float]:
    """Train for ``seconds`` of wall time (the iteration running at the end finishes)."""
    scores, learner_idle, sampler_idle = [], [], []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        result = algo.train()
        scores.append(float(result["critic/score/mean"]))
        learner_idle.append(float(result["async/learner_idle_frac"]))
        sampler_idle.append(float(result["async/sampler_idle_frac"]))
    elapsed = time.perf_counter() - start
    return {"iterations": len(scores), "seconds": elapsed,
            "iters_per_min": 60.0 * len(scores) / elapsed,
            "reward_end": statistics.fmean(scores[-LAST:]),
            "learner_idle_frac": statistics.fmean(learner_idle),
            "sampler_idle_frac": statistics.fmean(sampler_idle)}


def turns(rounds: int, seconds: float, run: Any = None) -> list[dict[str, Any]]:
    """``rounds`` rounds of one run per mode, the order rotating (sync first in even
    rounds, async first in odd ones); ``run(mode, seconds)`` does one run."""
    run = run or _run_fresh
    rows = []
    names = list(MODES)
    for round_ in range(rounds):
        shift = round_ % len(names)
        for mode in names[shift:] + names[:shift]:
            rows.append({"round": round_, "mode": mode, **run(mode, seconds)})
    return rows


def _run_fresh(mode: str, seconds: float, lr: float | None = None) -> dict[str, float]:
    algo = build(mode, lr=lr)
    try:
        return run_for(algo, seconds)
    finally:
        algo.stop()


def summarize(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per-mode means of every figure, and ``ratio``: async / sync."""
    keys = ("iters_per_min", "reward_end", "learner_idle_frac", "sampler_idle_frac",
            "iterations")
    means = {mode: {k: statistics.fmean(r[k] for r in rows if r["mode"] == mode) for k in keys}
             for mode in MODES if any(r["mode"] == mode for r in rows)}
    if {"sync", "async"} <= set(means):
        means["ratio"] = {k: means["async"][k] / means["sync"][k] if means["sync"][k] else
                          float("nan") for k in keys}
    return means


def format_table(rows: list[dict[str, Any]], seconds: float) -> str:
    """The runs and the per-mode means as a Markdown table."""
    lines = [f"| run | mode | iterations in {seconds:g} s | iterations / min | reward (last "
             f"{LAST}) | learner idle | sampler idle |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['round'] + 1} | {r['mode']} | {r['iterations']} | "
                     f"{r['iters_per_min']:.1f} | {r['reward_end']:.3f} | "
                     f"{r['learner_idle_frac']:.2f} | {r['sampler_idle_frac']:.2f} |")
    for mode, m in summarize(rows).items():
        fmt = "{:.2f}x" if mode == "ratio" else "{:.2f}"
        lines.append(f"| **mean** | **{mode}** | {fmt.format(m['iterations'])} | "
                     f"{fmt.format(m['iters_per_min'])} | {fmt.format(m['reward_end'])} | "
                     f"{fmt.format(m['learner_idle_frac'])} | "
                     f"{fmt.format(m['sampler_idle_frac'])} |")
    return "\n".join(lines)


def curve(mode: str, iterations: int, window: int = 20, lr: float | None = None) -> list[float]:
    """Mean reward of each ``window`` iterations over ``iterations`` (a fresh algorithm)."""
    algo = build(mode, lr=lr)
    try:
        scores = [float(algo.train()["critic/score/mean"]) for _ in range(iterations)]
    finally:
        algo.stop()
    return [statistics.fmean(scores[i:i + window]) for i in range(0, len(scores), window)]


def format_curve(curves: dict[str, list[float]], window: int = 20) -> str:
    """Reward per ``window`` iterations, one column per mode, as a Markdown table."""
    names = list(curves)
    lines = ["| iterations | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for i in range(max(len(c) for c in curves.values())):
        cells = [f"{curves[n][i]:.3f}" if i < len(curves[n]) else "" for n in names]
        lines.append(f"| {i * window + 1}-{(i + 1) * window} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Run the turns and print (and with ``--json`` write) the table."""
    import ray

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=90.0, help="wall time per run")
    parser.add_argument("--rounds", type=int, default=2, help="runs per mode, in turns")
    parser.add_argument("--json", help="write the runs and means here")
    parser.add_argument("--curve", type=int, default=0, metavar="N",
                        help="instead: the reward curve of N iterations per mode "
                        f"({', '.join(CURVE_MODES)}), one after the other")
    parser.add_argument("--lr", type=float, default=None,
                        help="learning rate (default: the demo's)")
    args = parser.parse_args(argv)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, object_store_memory=500 * 1024**2)
    try:
        if args.curve:
            curves = {mode: curve(mode, args.curve, lr=args.lr) for mode in CURVE_MODES}
        else:
            rows = turns(args.rounds, args.seconds, functools.partial(_run_fresh, lr=args.lr))
    finally:
        ray.shutdown()
    if args.curve:
        print(format_curve(curves))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"curves": curves, "window": 20}, f, indent=2)
        return
    print(format_table(rows, args.seconds))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": rows, "means": summarize(rows)}, f, indent=2)


if __name__ == "__main__":
    main()
