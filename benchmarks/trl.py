"""Suite ``trl``: side by side with TRL's GRPOTrainer: step time, time to first step,
process-tree memory.

    python -m benchmarks trl [--workload 5m7 smollm2] [--beta 0 0.04]
        [--rounds 3] [--steps 8] [--warmup 2] [--threads 1]

The same workload (`benchmarks.trl_runs.SideBySideSpec`) runs in a fresh process per
system, in rounds: TRL (``GRPOTrainer``, transformers sampling) -> ours with vLLM ->
ours with the transformers sampler, for each ``--beta``.  TRL runs under
``benchmarks/.venv-trl`` (`benchmarks.trl_env`, created on first use).  While a process
runs, this one samples the memory of its whole process tree every 0.2 s
(`benchmarks.process_tree`: PSS, and RSS for reference).  Printed: a Markdown table per
beta with medians, the ratios ours / TRL and whether each target holds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import load_average
from benchmarks.process_tree import TreeSampler, process_table, tree_members
from benchmarks.trl_runs import PRECISIONS, SYSTEMS, WORKLOADS, SideBySideSpec

TITLE = "side by side with TRL's GRPOTrainer (ratios ours / TRL)"
DESCRIPTION = """
The same workload (Arithmetic-v0, 32-token responses, fp32, AdamW, 1 thread) in a fresh process
per system, in rounds: TRL's `GRPOTrainer` (its own venv, `benchmarks/.venv-trl`), ours with
vLLM, ours with transformers. Step = previous step's end to this one's (median); memory = the
process tree's peak PSS; targets are ratios ours / TRL (`smollm2`: `make install-smollm2`).
"""
LABELS = {"trl": "TRL", "vllm": "ours vLLM", "hf": "ours HF"}
OURS = ("vllm", "hf")
# (metric label, summary key, the largest ratio ours / TRL allowed per sampler).
TARGETS: list[tuple[str, str, dict[str, float]]] = [
    ("step time (s)", "step_period_s", {"vllm": 0.8, "hf": 0.8}),
    ("time to first step (s)", "time_to_first_step_s", {"vllm": 2.0, "hf": 1.5}),
    ("peak memory, process tree PSS (MB)", "peak_pss_mb", {"vllm": 1.5, "hf": 1.5}),
]
# Shown for reference, no target.
INFO: list[tuple[str, str]] = [
    ("step begin->end (s)", "step_s"),
    ("first step, warm-up (s)", "first_step_s"),
    ("process start to main() (s)", "process_start_s"),
    ("peak memory, process tree RSS sum (MB)", "peak_rss_mb"),
    ("processes in the tree (max)", "max_processes"),
    ("mean completion length (tokens)", "mean_completion_length"),
]
NO_RATIO = {"max_processes"}
SAMPLE_INTERVAL_S = 0.2
PSS_EVERY = 5  # PSS every 5th sample (1 s): reading it costs the parent CPU beside the run


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks trl",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--workload", choices=tuple(WORKLOADS), nargs="+", default=["5m7"],
                   help="5m7: a 5.7M-parameter Qwen2 (plain prompts 3+4=); smollm2: "
                   "SmolLM2-135M-Instruct (chat prompts); several: one after the other")
    p.add_argument("--beta", type=float, nargs="+", default=[0.0],
                   help="KL coefficient(s); 0 = no reference model (one table each)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of TRL -> vLLM -> HF")
    p.add_argument("--steps", type=int, default=8, help="measured steps per process")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured steps first (>= 1)")
    p.add_argument("--threads", type=int, default=1, help="torch threads in every process")
    p.add_argument("--systems", default=",".join(SYSTEMS), help="subset of trl,vllm,hf")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--precision", choices=PRECISIONS, default="fp32",
                   help="fp32: fp32 compute everywhere; bf16: bf16 compute over fp32 master "
                   "weights in every system (TRL's default bf16=True: autocast; ours: "
                   "model_dtype='bfloat16')")
    p.add_argument("--natural-length", action="store_true",
                   help="keep the model's EOS: responses end when sampled (lengths differ by "
                   "chance between systems; the table reports them); default: every "
                   "response runs to 32 tokens")
    p.add_argument("--timeout", type=float, default=3600.0, help="per process, seconds")
    p.add_argument("--wait-for-load", type=float, default=None, metavar="LOAD",
                   help="before each process, wait (up to 10 min) for the 1-minute load "
                   "average to fall below LOAD")
    p.add_argument("--verbose", action="store_true", help="show the processes' output")
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error("--warmup must be >= 1: a step's time runs from the previous step's end")
    if args.steps < 1 or args.rounds < 1:
        p.error("--steps and --rounds must be >= 1")
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        p.error(f"--systems: unknown {sorted(unknown)}; choose from {','.join(SYSTEMS)}")
    return args


# ---------------------------------------------------------------------- pure parts


def summarise_run(raw: dict[str, Any], warmup: int, steps: int) -> dict[str, Any]:
    """One process's figures from what it wrote and the parent measured.

    ``step_period_s``: per measured step, the time from the previous step's end to this
    step's end, i.e. everything the loop does per step (TRL's logging after
    ``on_step_end``, ours' result handling) -> the step time compared; ``step_s``: begin
    to end of the step alone.  Medians over the measured steps ``warmup..warmup+steps-1``.
    """
    begins, ends = raw["step_begin"], raw["step_end"]
    if len(ends) < warmup + steps or len(begins) < warmup + steps:
        raise ValueError(f"{raw.get('system')}: {len(ends)} steps recorded, "
                         f"{warmup + steps} expected")
    measured = range(warmup, warmup + steps)
    periods = [ends[k] - ends[k - 1] for k in measured]
    durations = [ends[k] - begins[k] for k in measured]
    lengths = raw.get("completion_lengths") or []
    return {
        "step_periods": periods,
        "step_durations": durations,
        "step_period_s": statistics.median(periods),
        "step_s": statistics.median(durations),
        "first_step_s": ends[0] - begins[0],
        "time_to_first_step_s": raw["first_step_wall"] - raw["spawn_ts"],
        "process_start_s": raw["process_start_wall"] - raw["spawn_ts"],
        "mean_completion_length": statistics.fmean(lengths) if lengths else float("nan"),
        **{k: raw[k] for k in ("peak_pss_mb", "peak_rss_mb", "max_processes", "params",
                               "torch_threads", "sampler_cpu_s", "clipped_ratio")
           if k in raw},
    }


def pool_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One system's rounds: step medians over every measured step of every round, the
    other figures as medians over rounds."""
    periods = [p for run in runs for p in run["step_periods"]]
    durations = [d for run in runs for d in run["step_durations"]]
    pooled: dict[str, Any] = {"rounds": len(runs), "step_period_s": statistics.median(periods),
                              "step_s": statistics.median(durations)}
    for key in ("time_to_first_step_s", "process_start_s", "first_step_s", "peak_pss_mb",
                "peak_rss_mb", "max_processes", "mean_completion_length"):
        values = [run[key] for run in runs if key in run]
        if values:
            pooled[key] = statistics.median(values)
    return pooled


def ratio(ours: float | None, trl: float | None) -> float | None:
    if ours is None or trl is None or trl <= 0:
        return None
    return ours / trl


def target_rows(pooled: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per target: the values, the ratios ours / TRL and whether each holds (None: not run)."""
    rows = []
    trl = pooled.get("trl", {})
    for label, key, limits in TARGETS:
        row: dict[str, Any] = {"metric": label, "key": key,
                               "values": {s: pooled[s].get(key) for s in pooled}}
        for system in OURS:
            r = ratio(pooled.get(system, {}).get(key), trl.get(key))
            row[f"ratio_{system}"] = r
            row[f"limit_{system}"] = limits[system]
            row[f"holds_{system}"] = None if r is None else r <= limits[system]
        rows.append(row)
    return rows


def _fmt(value: Any, key: str) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    if key.endswith("_mb") or key == "max_processes":
        return f"{value:.0f}"
    if key == "mean_completion_length":
        return f"{value:.1f}"
    return f"{value:.3f}"


def _verdict(holds: bool | None) -> str:
    return "-" if holds is None else ("yes" if holds else "**no**")


def format_table(pooled: dict[str, dict[str, Any]]) -> str:
    """Markdown: medians per system, ratios ours / TRL, targets and whether they hold."""
    lines = ["| metric | TRL | ours vLLM | ours HF | vLLM / TRL | HF / TRL | target "
             "(vLLM, HF) | holds (vLLM, HF) |", "|---|---:|---:|---:|---:|---:|---|---|"]

    def cells(key: str) -> list[str]:
        return [_fmt(pooled.get(s, {}).get(key), key) for s in SYSTEMS]

    for row in target_rows(pooled):
        ratios = [_fmt(row[f"ratio_{s}"], "ratio") for s in OURS]
        target = f"<= {row['limit_vllm']:g}x, <= {row['limit_hf']:g}x"
        holds = f"{_verdict(row['holds_vllm'])}, {_verdict(row['holds_hf'])}"
        lines.append(f"| {row['metric']} | " + " | ".join([*cells(row["key"]), *ratios,
                                                          target, holds]) + " |")
    for label, key in INFO:
        ratios = ["" if key in NO_RATIO else
                  _fmt(ratio(pooled.get(s, {}).get(key), pooled.get("trl", {}).get(key)), "ratio")
                  for s in OURS]
        lines.append(f"| {label} | " + " | ".join([*cells(key), *ratios, "", ""]) + " |")
    return "\n".join(lines)


def format_report(report: dict[str, Any]) -> str:
    spec = report["spec"]
    out = []
    for beta, block in report["results"].items():
        out.append(f"### {spec.get('model', spec['workload'])} ({block.get('params', '?')} "
                   f"params), beta={beta}: "
                   f"{spec['prompts']} prompts x {spec['group_size']}, "
                   f"{spec['max_new_tokens']} new tokens"
                   f"{'' if spec.get('fixed_length', True) else ' at most (natural length)'}, "
                   f"T={spec['temperature']:g}, {spec.get('precision', 'fp32')}, "
                   f"lr {spec['lr']:g}, {spec['threads']} thread(s); {report['rounds']} "
                   f"round(s) x {spec['steps']} steps after {spec['warmup']} warm-up")
        out.append("")
        out.append(format_table(block["pooled"]))
        out.append("")
    out.append(f"Memory: {report['memory_measure']}")
    out.append(f"Loads at each start: {report['loads']}; versions: {report['versions']}")
    return "\n".join(out)


# ---------------------------------------------------------------------- the runs

MEMORY_MEASURE = (
    "peak over the run of the sum over the process, its descendants and its session of "
    "PSS (/proc/<pid>/smaps_rollup, read by the parent every "
    f"{SAMPLE_INTERVAL_S * PSS_EVERY:g} s, less often when a reading costs more than 1% of "
    "a core); RSS sum (/proc/<pid>/statm, every "
    f"{SAMPLE_INTERVAL_S:g} s) for reference: it counts shared pages once per process")


def _repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def child_env(threads: int) -> dict[str, str]:
    """The environment of every measured process (the same for all systems)."""
    root = str(_repo_root())
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else f"{root}{os.pathsep}{path}",
            "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "RAY_DEDUP_LOGS": "0", "PYTHONWARNINGS": "ignore"}


def run_process(system: str, spec: SideBySideSpec, python: str, timeout: float,
                verbose: bool = False) -> dict[str, Any]:
    """Run one system in a fresh process (a session of its own), sampling its tree's memory."""
    with tempfile.TemporaryDirectory(prefix="trl_side_by_side_") as folder:
        out, log = Path(folder, "result.json"), Path(folder, "log.txt")
        with open(log, "w") as sink:
            spawn_ts = time.time()
            cmd = [python, "-m", "benchmarks.trl_runs", "--system", system, "--spec",
                   json.dumps(spec.to_json()), "--spawn-ts", repr(spawn_ts), "--out", str(out)]
            proc = subprocess.Popen(cmd, cwd=_repo_root(), env=child_env(spec.threads),
                                    stdout=None if verbose else sink, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            sampler = TreeSampler(proc.pid, SAMPLE_INTERVAL_S, pss_every=PSS_EVERY).start()
            code: int | None = None
            try:
                code = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:  # also on Ctrl-C or SIGTERM (main turns it into SystemExit)
                peak = sampler.stop()
                _end_stragglers(proc, grace_s=10.0 if code is not None else 0.0)
        if code != 0 or not out.is_file():
            tail = "" if verbose else log.read_text()[-6000:]
            why = f"timed out after {timeout:.0f} s" if code is None else f"exit {code}"
            raise RuntimeError(f"the {system} run failed ({why}):\n{tail}")
        return {**json.loads(out.read_text()), **peak.to_json()}


def _end_stragglers(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """After the measured process: wait for what it started to exit, then end its group
    (the process group this benchmark created for the run: start_new_session)."""
    for signum in (None, signal.SIGTERM, signal.SIGKILL):
        if signum is not None:
            try:
                os.killpg(proc.pid, signum)
            except ProcessLookupError:
                return
        deadline = time.monotonic() + (grace_s if signum is None else 15.0)
        while True:
            if proc.poll() is not None and not tree_members(proc.pid, process_table()):
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)


def wait_until_load_below(limit: float, max_wait_s: float = 600.0) -> None:
    deadline = time.monotonic() + max_wait_s
    while load_average() >= limit and time.monotonic() < deadline:
        time.sleep(5)


def prepare_spec(args: argparse.Namespace, beta: float) -> SideBySideSpec:
    """The spec with the model folders (built or converted here, before any timing)."""
    from benchmarks.workloads import prepare_model
    from rllib_grpo.models import resolve_model

    name = WORKLOADS[args.workload][0]
    return SideBySideSpec(workload=args.workload, beta=beta, steps=args.steps,
                          warmup=args.warmup, threads=args.threads, lr=args.lr,
                          precision=args.precision,
                          fixed_length=not args.natural_length,
                          model_dir=prepare_model(name, fixed_length=not args.natural_length),
                          tokenizer_dir=resolve_model(name))


def run_all(args: argparse.Namespace, trl_python: str) -> dict[str, Any]:
    """Rounds of (per beta) TRL -> ours vLLM -> ours HF; a report of the pooled figures."""
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    specs = {beta: prepare_spec(args, beta) for beta in args.beta}
    runs: dict[float, dict[str, list[dict[str, Any]]]] = {b: {} for b in args.beta}
    loads: list[float] = []
    extra: dict[str, dict[str, Any]] = {}
    for index in range(args.rounds):
        for beta, spec in specs.items():
            for system in systems:
                if args.wait_for_load is not None:
                    wait_until_load_below(args.wait_for_load)
                load = load_average()
                loads.append(round(load, 2))
                print(f"round {index + 1}/{args.rounds}, beta={beta:g}: {LABELS[system]} "
                      f"(load {load:.2f}) ...", file=sys.stderr, flush=True)
                python = trl_python if system == "trl" else sys.executable
                raw = run_process(system, spec, python, args.timeout, args.verbose)
                extra.setdefault(system, {k: raw[k] for k in ("trl_version",) if k in raw})
                summary = {**summarise_run(raw, spec.warmup, spec.steps), "load_at_start": load}
                runs[beta].setdefault(system, []).append(summary)
                print(f"  step {summary['step_period_s']:.3f} s, first step at "
                      f"{summary['time_to_first_step_s']:.1f} s, PSS "
                      f"{summary.get('peak_pss_mb', 0):.0f} MB", file=sys.stderr, flush=True)
    spec0 = next(iter(specs.values()))
    results = {}
    for beta, by_system in runs.items():
        params = next((r[0].get("params") for r in by_system.values() if r), None)
        pooled = {s: pool_runs(r) for s, r in by_system.items()}
        results[f"{beta:g}"] = {"params": params, "runs": by_system, "pooled": pooled,
                                "targets": target_rows(pooled)}
    hidden = ("beta", "model_dir", "tokenizer_dir")  # per table; machine paths
    return {"spec": {**{k: v for k, v in spec0.to_json().items() if k not in hidden},
                     "model": WORKLOADS[args.workload][0]},
            "rounds": args.rounds, "systems": systems, "results": results,
            "memory_measure": MEMORY_MEASURE, "loads": loads,
            "versions": extra.get("trl", {})}


def target_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The suite's rows: per workload, beta and target, each system's median, the ratios
    ours / TRL measured in the same run, the target and whether it holds."""
    rows = []
    for beta, block in report["results"].items():
        pooled = block["pooled"]
        for target in block["targets"]:
            key = target["key"]
            rows.append({
                "model": report["spec"]["model"], "beta": float(beta),
                "metric": target["metric"],
                **{LABELS[s]: pooled.get(s, {}).get(key) for s in SYSTEMS},
                "vLLM / TRL": target["ratio_vllm"], "HF / TRL": target["ratio_hf"],
                "target": f"<= {target['limit_vllm']:g}x, <= {target['limit_hf']:g}x",
                "holds": f"{_verdict(target['holds_vllm'])}, {_verdict(target['holds_hf'])}",
            })
    return rows


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Every ``--workload`` side by side in rounds; the target rows of all of them."""
    args = parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds like Ctrl-C, so that the run's process group
    # (a session of its own, which a signal to this process does not reach) is ended too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    from benchmarks.trl_env import ensure_trl_venv

    trl_python = str(ensure_trl_venv()) if "trl" in args.systems.split(",") else ""
    rows = []
    for workload in args.workload:
        report = run_all(argparse.Namespace(**{**vars(args), "workload": workload}), trl_python)
        print(format_report(report))
        rows += target_table(report)
    return rows
