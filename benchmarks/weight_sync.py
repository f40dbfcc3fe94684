"""Suite ``weight_sync``: GRPO's weight sync on each CPU path against the physical floors,
measured in one run, on random models shaped like SmolLM2-135M and Qwen2.5-0.5B (built
from their configs: nothing is downloaded).

    python -m benchmarks weight_sync                       # both shapes
    python -m benchmarks weight_sync --shapes smollm2 --reps 3

For each shape, with the transformers sampler (it copies into its live parameters):

* **local**: learner and env runner in the driver (``num_learners=0``,
  ``num_env_runners=0``): `WeightSync.sync` against ``copy_`` of the same tensors into
  the sampler's, in place, in the same process (target: <= 2x);
* **remote**: one env runner actor on this node: the sync through the node's shared
  weights file (``auto``: ``shm``) against a memcpy of the same bytes in one process
  (target: <= 6x, the acceptance check ``../shared/checks/weight-sync-remote.sh``), and
  through Ray's object store (``object_store``, RLlib's way).

Every figure is the median of ``--reps`` rounds after a warm-up round; in a round each
timed function runs once, in turns, so that all see the same load (the machine is
shared).  A sync's time is the driver's wall time of `WeightSync.sync`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

TITLE = "weight sync on each CPU path against its floor"
DESCRIPTION = """
Random models of SmolLM2-135M's and Qwen2.5-0.5B's shapes, the transformers sampler, each path
once per round in turns (medians). Targets: the local sync <= 2x `copy_` of the same tensors in
place; the remote sync through shared memory <= 6x a memcpy of the same bytes.
"""
SHAPES = ("smollm2", "qwen05b")
SMOLLM2_SHAPE: dict[str, Any] = {  # HuggingFaceTB/SmolLM2-135M's config.json
    "version": 1, "seed": 0, "vocab_size": 49_152, "hidden_size": 576, "intermediate_size": 1536,
    "num_layers": 30, "num_heads": 9, "num_kv_heads": 3, "max_position_embeddings": 8192,
    "rope_theta": 100_000.0, "save_dtype": "float32",
}
MODEL_SMOLLM2 = "builtin:smollm2-shape"
DTYPES = {"smollm2": "float32", "qwen05b": "bfloat16"}  # the 0.5B shape in bf16, as on GPUs


def _model_folder(shape: str) -> str:
    from benchmarks.workloads import (
        MODEL_QWEN05B,
        _build_qwen05b_shape,
        register_benchmark_models,
    )
    from rllib_grpo.models import register_builtin_model, resolve_model

    register_benchmark_models()
    register_builtin_model(MODEL_SMOLLM2, _build_qwen05b_shape, params=SMOLLM2_SHAPE)
    return resolve_model(MODEL_SMOLLM2 if shape == "smollm2" else MODEL_QWEN05B)


def _build(folder: str, dtype: str, num_env_runners: int, setting: str = "auto") -> Any:
    from rllib_grpo import GRPOConfig

    config = (GRPOConfig()
              .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
              .training(model_path=folder, model_dtype=dtype, sampler="hf", prompts_per_step=2,
                        group_size=2, max_prompt_length=16, max_response_length=2,
                        use_kl_loss=False, lr=1e-6, weight_sync_transport=setting)
              .env_runners(num_env_runners=num_env_runners,
                           create_local_env_runner=num_env_runners == 0))
    return config.build_algo()


def _interleaved(funcs: dict[str, Any], reps: int) -> dict[str, float]:
    """Median seconds of each function, run in turns (one call of each per round, the order
    rotating) so that every figure sees the same load on a shared machine; one warm-up
    round first."""
    times: dict[str, list[float]] = {name: [] for name in funcs}
    names = list(funcs)
    for round_ in range(reps + 1):
        shift = round_ % len(names)  # each path follows each other one in some round
        for name in names[shift:] + names[:shift]:
            func = funcs[name]
            start = time.perf_counter()
            seconds = func()
            if round_:  # round 0 warms up: groups, slots, buffers, first-touch page faults
                # A float is the function's own timing (the raw broadcast's); else wall time.
                times[name].append(seconds if isinstance(seconds, float)
                                   else time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def _sync(algo: Any) -> dict[str, float]:
    """One `WeightSync.sync`; an error if it left a runner out (a figure without its
    runner would be no figure of the path)."""
    from rllib_grpo.rllib.algorithm.weight_sync import DROPPED_METRIC, WeightSync

    if getattr(algo, "_weight_sync", None) is None:
        algo._weight_sync = WeightSync(algo)
    metrics = algo._weight_sync.sync()
    if metrics[DROPPED_METRIC]:
        raise RuntimeError("a sync left an env runner out (see the log): no measurement")
    return metrics


def _unique_state(algo: Any) -> dict[str, Any]:
    from rllib_grpo.rllib.learner.weight_sender import policy_module
    from rllib_grpo.weights.shm import split_aliases

    return split_aliases(policy_module(algo.learner_group._learner).lm.state_dict())[0]


def measure_local(folder: str, dtype: str, reps: int) -> dict[str, Any]:
    import torch

    algo = _build(folder, dtype, 0)
    try:
        source = _unique_state(algo)
        live = algo.env_runner.sampler.model.state_dict(keep_vars=True)
        targets = [(live[name], tensor) for name, tensor in source.items()]

        @torch.no_grad()
        def copy_in_place() -> None:
            for target, tensor in targets:
                target.copy_(tensor)

        times = _interleaved({"local_sync_s": lambda: _sync(algo),
                              "copy_in_place_s": copy_in_place}, reps)
        metrics = _sync(algo)
        transports = algo._weight_sync.transport_names()
    finally:
        algo.stop()
    return {**times, "local_bytes": metrics["weight_sync/bytes"],
            "local_transport": transports[0]}


def measure_remote(folder: str, dtype: str, reps: int) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for setting in ("auto", "object_store"):
        algo = _build(folder, dtype, 1, setting)
        try:
            metrics = _sync(algo)
            transport = algo._weight_sync.transport_names()[1]
            out[f"{transport}_bytes"] = metrics["weight_sync/bytes"]
            if transport == "shm":
                nbytes = int(metrics["weight_sync/bytes"])
                source = torch.ones(nbytes, dtype=torch.uint8)
                target = torch.empty(nbytes, dtype=torch.uint8)
                out.update(_interleaved({"shm_sync_s": lambda a=algo: _sync(a),
                                         "memcpy_s": lambda t=target, s=source: t.copy_(s)},
                                        reps))
            else:
                out.update(_interleaved({"object_store_sync_s": lambda a=algo: _sync(a)},
                                        reps))
        finally:
            algo.stop()
    return out


def ratios(r: dict[str, float]) -> dict[str, float]:
    return {
        "local / copy_ in place": r["local_sync_s"] / r["copy_in_place_s"],
        "shm (auto) / memcpy": r["shm_sync_s"] / r["memcpy_s"],
        "shm (auto) / object store": r["shm_sync_s"] / r["object_store_sync_s"],
    }


def shape_row(shape: str, dtype: str, r: dict[str, float]) -> dict[str, Any]:
    """One shape's row: each path's milliseconds and the ratios to their floors."""
    row: dict[str, Any] = {"shape": shape, "dtype": dtype,
                           "MiB per sync": round(r["shm_bytes"] / 2**20)}
    for key, label in (("local_sync_s", "local ms"), ("copy_in_place_s", "copy_ in place ms"),
                       ("shm_sync_s", "shm ms"), ("object_store_sync_s", "object store ms"),
                       ("memcpy_s", "memcpy ms")):
        row[label] = r[key] * 1000
    return {**row, **ratios(r)}


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Both paths of every shape, against their floors; one row per shape."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks weight_sync",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the actors inherit it
    import ray
    import torch

    torch.set_num_threads(1)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=3 * 2**30)
    rows = []
    try:
        for shape in args.shapes:
            folder, dtype = _model_folder(shape), DTYPES[shape]
            measured = {**measure_local(folder, dtype, args.reps),
                        **measure_remote(folder, dtype, args.reps)}
            rows.append(shape_row(shape, dtype, measured))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        ray.shutdown()
    return rows
