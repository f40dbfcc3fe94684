"""Issue #28's ratio: a remote env runner's weight sync through vLLM's weight-transfer API
(this checkout) against the shared-memory path from before it (another checkout, e.g. the
commit before the merge), SmolLM2-135M's shape, in fresh processes taken in turns.

    git worktree add /tmp/pre28 7935fbd^1
    python -m benchmarks.weight_sync_ratio --old-root /tmp/pre28 --rounds 3 \
        --json benchmarks/results/weight_sync_ratio.json
    python -m benchmarks.weight_sync_ratio --old-root /tmp/pre28 --rounds 3 --dtype bfloat16

Each round runs one process per path (``old``, ``api``), the order alternating (A B, B A,
...), so that both see the same load on a shared machine.  A process starts Ray, builds a
GRPO algorithm with one remote env runner (transformers sampler, ``weight_sync_transport``
``auto``: shared memory on one node, on both sides), syncs twice to warm up (the first
connects), then times ``--syncs`` syncs (the driver's wall time of ``WeightSync.sync``, what
``timing_s/update_weights`` reports), each followed by a memcpy of the same bytes in the
same process (the yardstick: it moves with the load).  The process runs from its
checkout's root with ``PYTHONPATH`` set to it, and checks that the driver and the env
runner imported ``rllib_grpo`` from there.  Per path: the median over all its syncs (and
memcpys) of all rounds; the ratio is API / old.  A process that fails (Ray's OOM killer
on a shared machine) is run once more, and its failure kept in the JSON.

The model folder (random weights of SmolLM2-135M's config, nothing downloaded) is built
once by this process and loaded by every child.  Only names both checkouts have are used
in a child: ``GRPOConfig``, ``WeightSync``.
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

PATHS = ("old", "api")
API_ROOT = str(Path(__file__).resolve().parent.parent)


def _child(root: str, folder: str, dtype: str, syncs: int, out: str) -> None:
    """One process: build, warm up, time ``syncs`` syncs and memcpys; write them to ``out``."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the runner actor inherits it
    import ray
    import torch

    import rllib_grpo

    torch.set_num_threads(1)
    here = str(Path(rllib_grpo.__file__).resolve())
    if not here.startswith(str(Path(root).resolve()) + os.sep):
        raise SystemExit(f"rllib_grpo came from {here}, not from {root}")
    from rllib_grpo import GRPOConfig
    from rllib_grpo.rllib.algorithm.weight_sync import WeightSync

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=2 * 2**30)
    try:
        algo = (GRPOConfig()
                .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
                .training(model_path=folder, model_dtype=dtype, sampler="hf",
                          prompts_per_step=2, group_size=2, max_prompt_length=16,
                          max_response_length=2, use_kl_loss=False, lr=1e-6)
                .env_runners(num_env_runners=1, create_local_env_runner=False)).build_algo()
        runner_files = algo.env_runner_group.foreach_env_runner(
            lambda _: str(Path(__import__("rllib_grpo").__file__).resolve()),
            local_env_runner=False)
        if any(not f.startswith(str(Path(root).resolve()) + os.sep) for f in runner_files):
            raise SystemExit(f"the env runner imported rllib_grpo from {runner_files}")
        sync = WeightSync(algo)
        metrics = {}
        for _ in range(2):  # the first places the runner and connects; then first touches
            metrics = sync.sync()
        nbytes = int(metrics["weight_sync/bytes"])
        source = torch.ones(nbytes, dtype=torch.uint8)
        target = torch.empty(nbytes, dtype=torch.uint8)
        target.copy_(source)
        sync_s, memcpy_s = [], []
        for _ in range(syncs):
            start = time.perf_counter()
            sync.sync()
            sync_s.append(time.perf_counter() - start)
            start = time.perf_counter()
            target.copy_(source)
            memcpy_s.append(time.perf_counter() - start)
        record = {"sync_s": sync_s, "memcpy_s": memcpy_s, "bytes": nbytes,
                  "transports": {str(k): v for k, v in sync.transport_names().items()},
                  "rllib_grpo": here, "load": os.getloadavg()}
        algo.stop()
    finally:
        ray.shutdown()
    with open(out, "w") as f:
        json.dump(record, f)


def run_child(path: str, root: str, folder: str, dtype: str, syncs: int) -> dict[str, Any]:
    """One fresh process of ``path``, from ``root`` with ``PYTHONPATH=root``."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = tmp.name
    env = {**os.environ, "PYTHONPATH": root, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, __file__, "--child", root, "--folder", folder,
               "--dtype", dtype, "--syncs", str(syncs), "--out", out]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{path} process failed ({done.returncode}):\n{done.stderr[-3000:]}")
    with open(out) as f:
        record = json.load(f)
    os.unlink(out)
    record.update(path=path, process_s=time.perf_counter() - start)
    return record


def for_results(records: list[dict[str, Any]], failures: list[dict[str, Any]]
                ) -> dict[str, Any]:
    """What `benchmarks/results` keeps of the processes: their timings and loads, no machine
    paths (each child checked where it imported ``rllib_grpo`` from), a failure's last line."""
    keep = ("path", "sync_s", "memcpy_s", "bytes", "transports", "load", "process_s")
    return {"processes": [{k: r[k] for k in keep if k in r} for r in records],
            "failed_processes": [{"round": f["round"], "path": f["path"],
                                  "error": _last_line(f["error"])} for f in failures]}


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _commit(root: str) -> str:
    done = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def summarise(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per path the medians over all its syncs and memcpys; API / old of each."""
    out: dict[str, Any] = {}
    for path in PATHS:
        mine = [r for r in records if r["path"] == path]
        syncs = [s for r in mine for s in r["sync_s"]]
        copies = [s for r in mine for s in r["memcpy_s"]]
        out[path] = {"sync_ms": 1000 * statistics.median(syncs),
                     "memcpy_ms": 1000 * statistics.median(copies),
                     "per_process_sync_ms": [1000 * statistics.median(r["sync_s"]) for r in mine],
                     "bytes": mine[0]["bytes"], "transports": mine[0]["transports"]}
        out[path]["sync/memcpy"] = out[path]["sync_ms"] / out[path]["memcpy_ms"]
    out["api/old"] = out["api"]["sync_ms"] / out["old"]["sync_ms"]
    out["api/old, each over its memcpy"] = out["api"]["sync/memcpy"] / out["old"]["sync/memcpy"]
    return out


def format_table(summary: dict[str, Any], dtype: str) -> str:
    old, api = summary["old"], summary["api"]
    rows = [f"| SmolLM2-135M shape, {dtype}, {api['bytes'] / 1e6:.0f} MB per sync | old (shm) "
            "| API (grpo_shm) |", "|---|---:|---:|",
            f"| remote sync, median | {old['sync_ms']:.0f} ms | {api['sync_ms']:.0f} ms |",
            f"| per process medians | {', '.join(f'{v:.0f}' for v in old['per_process_sync_ms'])}"
            f" | {', '.join(f'{v:.0f}' for v in api['per_process_sync_ms'])} |",
            f"| memcpy of the same bytes, median | {old['memcpy_ms']:.0f} ms | "
            f"{api['memcpy_ms']:.0f} ms |",
            f"| sync / memcpy | {old['sync/memcpy']:.2f}x | {api['sync/memcpy']:.2f}x |",
            f"| **API / old** | | **{summary['api/old']:.2f}x** |",
            f"| API / old, each over its memcpy | | {summary['api/old, each over its memcpy']:.2f}x |"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old-root", default="/tmp/pre28",
                        help="checkout of the old path (git worktree add /tmp/pre28 7935fbd^1)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--syncs", type=int, default=7, help="timed syncs per process")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.folder, args.dtype, args.syncs, args.out)
        return 0
    if not os.path.isdir(os.path.join(args.old_root, "rllib_grpo")):
        parser.error(f"--old-root {args.old_root}: no checkout there "
                     "(git worktree add /tmp/pre28 7935fbd^1)")
    sys.path.insert(0, API_ROOT)
    from benchmarks.weight_sync import _model_folder

    folder = _model_folder("smollm2")
    roots = {"old": str(Path(args.old_root).resolve()), "api": API_ROOT}
    records, loads, failures = [], [os.getloadavg()], []
    for round_ in range(args.rounds):
        for path in PATHS if round_ % 2 == 0 else PATHS[::-1]:
            try:
                record = run_child(path, roots[path], folder, args.dtype, args.syncs)
            except RuntimeError as error:  # e.g. Ray's OOM killer on a shared machine: again
                print(f"round {round_} {path}: {str(error).splitlines()[0]}; once more",
                      flush=True)
                failures.append({"round": round_, "path": path, "error": str(error)[-2000:]})
                record = run_child(path, roots[path], folder, args.dtype, args.syncs)
            records.append(record)
            print(f"round {round_} {path}: sync median "
                  f"{1000 * statistics.median(record['sync_s']):.0f} ms, memcpy "
                  f"{1000 * statistics.median(record['memcpy_s']):.0f} ms, load "
                  f"{record['load'][0]:.2f}", flush=True)
        loads.append(os.getloadavg())
    summary = summarise(records)
    print(format_table(summary, args.dtype))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, **for_results(records, failures), "dtype": args.dtype,
                       "rounds": args.rounds, "syncs": args.syncs,
                       "old_commit": _commit(roots["old"]), "api_commit": _commit(API_ROOT),
                       "load_averages": loads}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
