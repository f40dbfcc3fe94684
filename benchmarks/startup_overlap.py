"""Ray's start and the run's imports: one after the other, or overlapped (`init_local_ray`).

    python -m benchmarks.startup_overlap [--rounds 3] [--sampler hf|vllm] [--json PATH]

Each measurement is a fresh process: it builds the side-by-side benchmark's `GRPOConfig`
(which imports RLlib, not transformers), then times from there until Ray is up and
`modules_to_prefetch` are imported, in one of three ways, taken in turns round by round:

* ``sequential``: ``ray.init`` (as `init_local_ray` calls it), then the imports;
* ``overlapped``: `init_local_ray` itself (the imports in a thread at nice +10).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODES = ("sequential", "overlapped")


def measure(mode: str, sampler: str) -> dict[str, float]:
    """In this process: seconds from the config built to Ray up and the imports done."""
    import ray

    from benchmarks.trl_runs import SideBySideSpec, build_ours
    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.algorithm import local_ray

    config = build_ours(SideBySideSpec(model_dir="builtin:qwen2-5m7"), sampler)
    kwargs = {"num_cpus": 2, "object_store_memory": 500 * 1024**2, "log_to_driver": False,
              "configure_logging": False}
    start = time.perf_counter()
    if mode == "sequential":
        ray.init(address="local", include_dashboard=False,
                 _system_config=local_ray.ray_system_config(config), **kwargs)
        ray_up = time.perf_counter()
        cpu_tuning._import_quietly(cpu_tuning.modules_to_prefetch(config))
    else:
        local_ray.init_local_ray(config, **kwargs)
        ray_up = float("nan")  # inside init_local_ray
    done = time.perf_counter()
    ray.shutdown()
    return {"seconds": done - start, "ray_init_s": ray_up - start}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sampler", choices=("hf", "vllm"), default="hf")
    p.add_argument("--json", default=None)
    p.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child process
    args = p.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.sampler)))
        return 0
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(root), os.environ.get("PYTHONPATH"))))}
    runs: dict[str, list[float]] = {mode: [] for mode in MODES}
    loads = []
    for _ in range(args.rounds):
        for mode in MODES:
            loads.append(round(os.getloadavg()[0], 2))
            out = subprocess.run([sys.executable, "-m", "benchmarks.startup_overlap",
                                  "--one", mode, "--sampler", args.sampler],
                                 cwd=root, env=env, capture_output=True, text=True, check=True)
            runs[mode].append(json.loads(out.stdout.strip().splitlines()[-1])["seconds"])
            print(f"{mode:15s} {runs[mode][-1]:.2f} s (load {loads[-1]})", flush=True)
    report = {"sampler": args.sampler, "rounds": args.rounds, "seconds": runs,
              "median_s": {mode: statistics.median(v) for mode, v in runs.items()},
              "loads": loads}
    print(json.dumps(report["median_s"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
