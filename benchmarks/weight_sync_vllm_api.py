"""Weight syncs through vLLM's weight-transfer API (our host engines), one engine per path,
connected once, measured in one run, interleaved, on SmolLM2-135M's shape (fp32, random
weights built in code):

    python -m benchmarks.weight_sync_vllm_api --reps 5 --json benchmarks/results/weight_sync_vllm_api.json
    python -m benchmarks.weight_sync_vllm_api --reps 5 --dtype bfloat16  # a bf16 wire

* **full**: ``grpo_shm`` (buckets through shared memory, what ``auto`` gives a runner on the
  learner's node) into a transformers sampler, against a memcpy of the same bytes;
* **delta**: ``grpo_sparse_gloo`` after one AdamW step (as the learner steps) at the demo's
  learning rate (1e-3) and at 1e-6: bytes and seconds against a full ``grpo_shm`` sync of
  the same stepped weights.

The sender and the receiver share this process (the receiving runs on the engine's side
thread, as it does in a vLLM worker), so no Ray, no actor calls: the engines' own cost.
Each figure is the median of ``--reps`` rounds after a warm-up round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import torch

DEMO_LR = 1e-3  # rllib_grpo.cli.demos: the demos' lr
LRS = (DEMO_LR, 1e-6)


def _setup(dtype: str) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    from benchmarks.weight_sync import _model_folder
    from rllib_grpo.models import load_causal_lm
    from rllib_grpo.samplers import make_sampler

    folder = _model_folder("smollm2")
    learner = load_causal_lm(folder)
    sampler = make_sampler("hf", model_path=folder, dtype=dtype, seed=0)
    return learner, sampler, folder


def _source(learner: torch.nn.Module, wire_dtype: torch.dtype) -> Any:
    from rllib_grpo.weights.layout import plan_manifest, split_aliases
    from rllib_grpo.weights.trainer import ManifestSource

    unique, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(unique, aliases=aliases, wire_dtype=wire_dtype,
                             bucket_bytes=64 << 20)
    return ManifestSource(manifest, lambda name: unique[name].detach())


def _timed(func: Any) -> float:
    start = time.perf_counter()
    func()
    return time.perf_counter() - start


def run(reps: int, dtype: str = "float32") -> dict[str, Any]:
    """``dtype``: the receivers' (so the wire's) dtype; the learner keeps fp32 weights, as
    it does over bf16 samplers (verl's 1-3% changed elements are bf16 bits)."""
    from rllib_grpo.weights.delta import DeltaTracker, patch_nbytes
    from rllib_grpo.weights.trainer import connect_receiver
    from rllib_grpo.weights.wire import update_nbytes

    torch.set_num_threads(1)
    learner, full_receiver, folder = _setup(dtype)
    from rllib_grpo.samplers import make_sampler

    delta_receiver = make_sampler("hf", model_path=folder, dtype=dtype, seed=0)
    source = _source(learner, full_receiver.weight_dtype)
    full_receiver.prepare_weights(source.manifest)
    full = connect_receiver(full_receiver, "grpo_shm", source)  # once: no reconnect per path
    delta = connect_receiver(delta_receiver, "grpo_sparse_gloo")
    tracker = DeltaTracker()
    delta.send_weights(tracker.patches(source)[0])  # whole: the first after a join
    nbytes = source.manifest.nbytes
    src = torch.randn(nbytes // 4)
    dst = torch.empty_like(src)
    rows: dict[str, list[float]] = {"full_s": [], "memcpy_s": []}
    for lr in LRS:
        rows.update({f"delta_s@{lr:g}": [], f"delta_bytes@{lr:g}": [],
                     f"changed_frac@{lr:g}": [], f"full_after_step_s@{lr:g}": []})
    ids = torch.randint(0, 1000, (2, 64))
    for rep in range(reps + 1):
        full_s = _timed(full.send_weights)
        memcpy_s = _timed(lambda: dst.copy_(src))
        step_rows = {}
        for lr in LRS:
            optimizer = torch.optim.AdamW(learner.parameters(), lr=lr)
            learner(ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            start = time.perf_counter()
            patches, changed, total = tracker.patches(source)
            delta.send_weights(patches)
            step_rows[f"delta_s@{lr:g}"] = time.perf_counter() - start
            step_rows[f"delta_bytes@{lr:g}"] = float(sum(patch_nbytes(p) for p in patches))
            step_rows[f"changed_frac@{lr:g}"] = changed / total
            step_rows[f"full_after_step_s@{lr:g}"] = _timed(full.send_weights)
        if rep:  # the first round warms up
            rows["full_s"].append(full_s)
            rows["memcpy_s"].append(memcpy_s)
            for key, value in step_rows.items():
                rows[key].append(value)
    full_bytes = update_nbytes(full.client.last_update)
    full.shutdown()
    delta.shutdown()
    out: dict[str, Any] = {key: statistics.median(v) for key, v in rows.items()}
    out["full_bytes"] = float(full_bytes)
    out["full/memcpy"] = out["full_s"] / out["memcpy_s"]
    for lr in LRS:
        out[f"delta/full bytes@{lr:g}"] = out[f"delta_bytes@{lr:g}"] / full_bytes
        out[f"delta/full time@{lr:g}"] = out[f"delta_s@{lr:g}"] / out[f"full_after_step_s@{lr:g}"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the samplers' weights, so the wire's (the learner stays fp32)")
    args = parser.parse_args()
    out = run(args.reps, args.dtype)
    for key, value in out.items():
        print(f"{key:28s} {value:.4g}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
