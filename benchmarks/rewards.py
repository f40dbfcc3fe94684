"""Suite ``rewards``: reward-model throughput through the reward actor pool vs in process.

    python -m benchmarks rewards [--models builtin:demo-rm 256x4] [--samples 512] [--batch 64]

Scores the same ``--samples`` (arithmetic prompt, answer) pairs three ways and prints
samples/s for each:

1. **in process, one at a time**: `SequenceClassifierReward.score` per sample (batch 1),
   what a reward *function* wrapping a model would do;
2. **in process, batched**: one `score` call, ``--batch`` samples per forward pass;
3. **actor pool**: `ActorPoolReward` sending env-runner batches of ``--batch`` samples to
   ``--workers`` `RewardWorker` actors (one call per batch; ``--workers`` client threads
   stand for that many env runners), including Ray's round trip and serialisation.

A ``--models`` entry ``HIDDENxLAYERS`` builds a reward model of that size in code.  Every
side uses one torch thread (the actors get one CPU each, and Ray sets OMP_NUM_THREADS=1 in
them), so the comparison is per core.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

from rllib_grpo.models.model_registry import resolve_model  # noqa: E402
from rllib_grpo.rewards.reward_model import SequenceClassifierReward  # noqa: E402

TITLE = "reward models: in process one at a time, batched, and through the actor pool"
DESCRIPTION = """
The same (prompt, answer) pairs scored in process one sample at a time (a reward function
wrapping a model), in process in forward passes of 64, and through `ActorPoolReward` to one
`RewardWorker` actor in batches of 64 (Ray's round trip included); one torch thread each.
"""


def _pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    prompts = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=" for _ in range(n)]
    return prompts, [str(rng.randint(0, 18)) for _ in range(n)]


def _model_folder(model: str) -> str:
    """A registered model or folder, or ``HIDDENxLAYERS``: a reward model built in code."""
    if "x" not in model or ":" in model or "/" in model:
        return resolve_model(model)
    hidden, layers = (int(n) for n in model.split("x"))
    from rllib_grpo.envs.arithmetic import ARITHMETIC_ALPHABET
    from rllib_grpo.models.reward_models import build_tiny_reward_model
    from rllib_grpo.models.tokenizers import build_char_tokenizer

    tokenizer = build_char_tokenizer(ARITHMETIC_ALPHABET)
    reward_model = build_tiny_reward_model(tokenizer, hidden_size=hidden, num_layers=layers,
                                           num_heads=max(2, hidden // 64),
                                           intermediate_size=4 * hidden)
    folder = tempfile.mkdtemp(prefix="rm-bench-")
    reward_model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def measure(model: str, samples: int, batch: int, workers: int) -> dict[str, Any]:
    """Samples/s of the three ways for one reward model (Ray must be up)."""
    folder = _model_folder(model)
    prompts, responses = _pairs(samples)
    local = SequenceClassifierReward(folder, batch_size=batch)
    results: dict[str, Any] = {"model": model, "samples": samples,
                               "parameters": local.num_parameters}
    local.score(prompts[:8], responses[:8])  # warm-up
    t0 = time.perf_counter()
    for p, r in zip(prompts, responses, strict=True):
        local.score([p], [r])
    results["one_at_a_time"] = samples / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    local.score(prompts, responses)
    results["batched"] = samples / (time.perf_counter() - t0)

    import ray

    from rllib_grpo.rewards.actor_client import ActorPoolReward
    from rllib_grpo.rewards.specs import RewardSpec
    from rllib_grpo.rllib.algorithm.reward_workers import RewardWorker

    spec = RewardSpec("rm", "model", 1.0, folder)
    names = [f"bench-rm-{model}-{i}" for i in range(workers)]
    actors = [ray.remote(RewardWorker).options(name=n, num_cpus=1, max_restarts=-1).remote(
        spec, dtype="float32", batch_size=batch) for n in names]
    ray.get([a.ready.remote() for a in actors])
    clients = [ActorPoolReward(names, first=i) for i in range(workers)]
    batches = [(prompts[i:i + batch], responses[i:i + batch]) for i in range(0, samples, batch)]
    clients[0].score_batch(*batches[0], [None] * len(batches[0][0]))  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(lambda job: clients[job[0] % workers].score_batch(
            *job[1], [None] * len(job[1][0])), enumerate(batches)))
    results["actor_pool"] = samples / (time.perf_counter() - t0)
    results["actor_calls"] = sum(c.num_calls for c in clients) - 1
    for actor in actors:
        ray.kill(actor)
    return results


def measurement_row(r: dict[str, Any]) -> dict[str, Any]:
    """One reward model's row: samples/s each way and the ratios measured in the same run."""
    return {"reward model": r["model"], "params (M)": round(r["parameters"] / 1e6, 3),
            "samples": r["samples"], "one at a time /s": r["one_at_a_time"],
            "batched /s": r["batched"], "actor pool /s": r["actor_pool"],
            "batched / one at a time": r["batched"] / r["one_at_a_time"],
            "actor pool / batched": r["actor_pool"] / r["batched"],
            "actor calls": r["actor_calls"]}


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Each ``--models`` entry scored the three ways; one row per model."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks rewards",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["builtin:demo-rm", "256x4"],
                        help="registered models or folders, or HIDDENxLAYERS built in code")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    import ray

    ray.init(address="local", num_cpus=max(2, args.workers + 1), include_dashboard=False,
             log_to_driver=False)
    try:
        rows = [measurement_row(measure(m, args.samples, args.batch, args.workers))
                for m in args.models]
    finally:
        ray.shutdown()
    return rows
