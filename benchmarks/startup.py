"""Time from process start to the first GRPO training step, as a new user meets it.

    python -m benchmarks.startup [--sampler vllm|hf] [--runs 3] [--src DIR] [--json out.json]

Each run is a fresh process running the demo (`python -m rllib_grpo.demo --iterations 2`)
with `GRPO.training_step` wrapped from outside, so the same probe measures any version of
the package (``--src``: the source tree put first on ``PYTHONPATH``, e.g. an older
checkout).  Per run it records

* ``startup``: process start (the OS's record) -> the first ``training_step`` begins;
* ``first_step`` and ``second_step``: the two steps' durations (a warm-up hidden in the
  first step shows as the difference);
* ``first_step_done``: process start -> the first step ends (the first progress line).

It prints the medians over ``--runs`` processes.  Timings on a shared machine vary: run
the versions you compare back to back.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MARKER = "STARTUP_PROBE "
# Runs in the child before the demo: wraps GRPO.training_step to time the first two steps.
PROBE = f"""
import json, sys, time, psutil
import rllib_grpo.rllib.algorithm.grpo as algorithm
start = psutil.Process().create_time()
marks = []
original = algorithm.GRPO.training_step
def timed(self, *args, **kwargs):
    t0 = time.time()
    try:
        return original(self, *args, **kwargs)
    finally:
        marks.append((t0, time.time()))
        if len(marks) == 2:
            (a0, a1), (b0, b1) = marks
            print({MARKER!r} + json.dumps({{"startup": a0 - start, "first_step": a1 - a0,
                  "second_step": b1 - b0, "first_step_done": a1 - start}}), flush=True)
algorithm.GRPO.training_step = timed
from rllib_grpo.cli.demo import main
sys.exit(main(sys.argv[1:]))
"""


def run_once(sampler: str, src: str | None, out: Path) -> dict[str, float]:
    """One fresh demo process (2 iterations); its probe record."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    cmd = [sys.executable, "-c", PROBE, "--iterations", "2", "--sampler", sampler,
           "--out", str(out)]
    proc = subprocess.run(cmd, env=env, cwd=out.parent, capture_output=True, text=True,
                          timeout=1800)
    for line in proc.stdout.splitlines():
        if line.startswith(MARKER):
            return json.loads(line[len(MARKER):])
    raise RuntimeError(f"no probe record (exit {proc.returncode}):\n{proc.stdout[-2000:]}\n"
                       f"{proc.stderr[-2000:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sampler", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--src", default=None, help="source tree to measure (default: "
                        "the installed / PYTHONPATH package)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    records = []
    with tempfile.TemporaryDirectory(prefix="rllib_grpo_startup_") as tmp:
        for i in range(args.runs):
            record = run_once(args.sampler, args.src, Path(tmp) / f"run{i}")
            records.append(record)
            print(f"run {i + 1}: " + "  ".join(f"{k} {v:.1f}s" for k, v in record.items()),
                  flush=True)
    medians = {key: statistics.median(r[key] for r in records) for key in records[0]}
    print(f"median of {len(records)} ({args.sampler}): "
          + "  ".join(f"{k} {v:.1f}s" for k, v in medians.items()))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"sampler": args.sampler, "src": args.src, "runs": records, "median": medians},
            indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
