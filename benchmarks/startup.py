"""Suite ``startup``: time from process start to the first GRPO training step, and the
process tree's size, as a new user meets them.

    python -m benchmarks startup [--samplers vllm hf] [--rewards builtin user] [--runs 3]
                                 [--src DIR]

Each run is a fresh process running the demo (`python -m rllib_grpo.demo --iterations 2`)
with `GRPO.training_step` wrapped from outside, so the same probe measures any version of
the package (``--src``: the source tree put first on ``PYTHONPATH``, e.g. an older
checkout).  Per run it records

* ``startup``: process start (the OS's record) -> the first ``training_step`` begins;
* ``first_step`` and ``second_step``: the two steps' durations (a warm-up hidden in the
  first step shows as the difference);
* ``first_step_done``: process start -> the first step ends (the first progress line);
* ``max_processes``, ``max_rss_gb``, ``max_pss_gb``: the most processes, and the largest
  resident / proportional set size summed over the run's process tree (the driver, Ray's
  GCS, raylet and workers, reward workers, vLLM's engine), sampled every 0.25 s.  PSS
  counts a page shared by n processes as 1/n in each, so forks are not counted twice;
* the package's own start-up breakdown (``timing_s/startup/<part>``) when it reports one.

``--rewards user`` scores with `user_arithmetic`, a reward function outside the package
(user code: it runs in killable reward worker processes), instead of the built-in one.

The rows are the medians over ``--runs`` processes.  Timings on a shared machine vary: run
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
import threading
from pathlib import Path
from typing import Any

import psutil

TITLE = "start-up: process start to the first step, and the process tree"
DESCRIPTION = """
Fresh processes run the demo (`python -m rllib_grpo.demo --iterations 2`) with the steps timed
from outside; the process tree is sampled every 0.25 s (PSS counts a page shared by n processes
1/n in each). Suite `trl` compares the time to the first step with TRL's.
"""

MARKER = "STARTUP_PROBE "
# A file path, so that any ``--src`` tree finds it.
USER_REWARD = f"{Path(__file__).resolve()}:user_arithmetic"
# Runs in the child before the demo: wraps GRPO.training_step to time the first two steps.
PROBE = f"""
import json, os, sys, time, psutil
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
                  "second_step": b1 - b0, "first_step_done": a1 - start}}),
                  flush=True)
algorithm.GRPO.training_step = timed
reward_fn = os.environ.get("STARTUP_PROBE_REWARD_FN")
if reward_fn:
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    build = GRPOConfig.build_algo
    def build_with_reward(self, *args, **kwargs):
        self.env_config = {{**self.env_config, "reward_fn": reward_fn}}
        return build(self, *args, **kwargs)
    GRPOConfig.build_algo = build_with_reward
from rllib_grpo.demo.run_demo import main
sys.exit(main(sys.argv[1:]))
"""


def user_arithmetic(data_source: str, solution_str: str, ground_truth: Any,
                    extra_info: dict | None = None) -> dict:
    """The built-in arithmetic reward, as user code (defined outside the package)."""
    from rllib_grpo.rewards.arithmetic_score import score_arithmetic

    return score_arithmetic(solution_str, ground_truth)


class TreeSampler(threading.Thread):
    """Samples a process and its descendants: the most processes and the largest summed
    RSS / PSS seen."""

    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        super().__init__(daemon=True)
        self.root, self.every_s = psutil.Process(pid), every_s
        self.max_processes, self.max_rss, self.max_pss = 0, 0, 0
        self.names: dict[str, int] = {}  # at the most processes
        self.pss_by_name: dict[str, float] = {}  # GB per process name, at the largest PSS
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            rss = pss = 0
            names: dict[str, int] = {}
            pss_by_name: dict[str, float] = {}
            for proc in procs:
                try:
                    info = proc.memory_full_info()
                    rss, pss = rss + info.rss, pss + info.pss
                    name = proc.name()
                    names[name] = names.get(name, 0) + 1
                    pss_by_name[name] = pss_by_name.get(name, 0.0) + info.pss / 1e9
                except psutil.Error:
                    continue
            if len(procs) > self.max_processes:
                self.max_processes, self.names = len(procs), names
            if pss > self.max_pss:
                self.max_pss, self.pss_by_name = pss, pss_by_name
            self.max_rss = max(self.max_rss, rss)
            self._done.wait(self.every_s)

    def stop(self) -> None:
        self._done.set()
        self.join()


def run_once(sampler: str, src: str | None, out: Path, user_reward: bool) -> dict[str, Any]:
    """One fresh demo process (2 iterations); its probe record and tree figures."""
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if user_reward:
        env["STARTUP_PROBE_REWARD_FN"] = USER_REWARD
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-c", PROBE, "--iterations", "2", "--sampler", sampler,
           "--out", str(out)]
    proc = subprocess.Popen(cmd, env=env, cwd=out.parent, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    tree = TreeSampler(proc.pid)
    tree.start()
    stdout, stderr = proc.communicate(timeout=1800)
    tree.stop()
    for line in stdout.splitlines():
        if line.startswith(MARKER):
            record = json.loads(line[len(MARKER):])
            record.update(max_processes=tree.max_processes, max_rss_gb=tree.max_rss / 1e9,
                          max_pss_gb=tree.max_pss / 1e9, processes=tree.names,
                          pss_gb_by_name={k: round(v, 3) for k, v in tree.pss_by_name.items()})
            return record
    raise RuntimeError(f"no probe record (exit {proc.returncode}):\n{stdout[-2000:]}\n"
                       f"{stderr[-2000:]}")


NUMBERS = ("startup", "first_step", "second_step", "first_step_done", "max_processes",
           "max_rss_gb", "max_pss_gb")


def run(argv: list[str]) -> list[dict[str, Any]]:
    """``--runs`` fresh demo processes per (sampler, reward); one row of medians each."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks startup",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--samplers", nargs="+", default=["vllm", "hf"], choices=["vllm", "hf"])
    parser.add_argument("--rewards", nargs="+", default=["builtin", "user"],
                        choices=["builtin", "user"],
                        help="user: score with user_arithmetic (user code: reward processes)")
    parser.add_argument("--runs", type=int, default=3, help="processes per (sampler, reward)")
    parser.add_argument("--src", default=None, help="source tree to measure (default: "
                        "the installed / PYTHONPATH package)")
    args = parser.parse_args(argv)
    records: dict[tuple[str, str], list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="rllib_grpo_startup_") as tmp:
        for i in range(args.runs):  # the combinations in turns, so load drift hits all alike
            for sampler in args.samplers:
                for reward in args.rewards:
                    record = run_once(sampler, args.src, Path(tmp) / f"{sampler}-{reward}-{i}",
                                      reward == "user")
                    records.setdefault((sampler, reward), []).append(record)
                    print(f"{sampler}, {reward} reward, run {i + 1}: "
                          + "  ".join(f"{k} {record[k]:.2f}" for k in NUMBERS), flush=True)
    return [median_row(sampler, reward, runs) for (sampler, reward), runs in records.items()]


def median_row(sampler: str, reward: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of one (sampler, reward)'s runs."""
    median = {key: statistics.median(r[key] for r in runs) for key in NUMBERS}
    return {"sampler": sampler, "reward": reward, "runs": len(runs),
            "start -> first step s": median["startup"], "first step s": median["first_step"],
            "second step s": median["second_step"], "processes": median["max_processes"],
            "tree PSS GB": median["max_pss_gb"], "tree RSS GB": median["max_rss_gb"]}
