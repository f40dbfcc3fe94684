"""Reward-model throughput: through the reward actor pool vs one sample at a time in process.

    python -m benchmarks.reward_models [--samples 512] [--batch 64] [--model builtin:demo-rm]
        [--hidden 256 --layers 4] [--json out.json]

Scores the same ``--samples`` (arithmetic prompt, answer) pairs three ways and prints
samples/s for each:

1. **in process, one at a time**: `SequenceClassifierReward.score` per sample (batch 1),
   what a reward *function* wrapping a model would do;
2. **in process, batched**: one `score` call, ``--batch`` samples per forward pass;
3. **actor pool**: `ActorPoolReward` sending env-runner batches of ``--batch`` samples to
   ``--workers`` `RewardWorker` actors (one call per batch; ``--workers`` client threads
   stand for that many env runners), including Ray's round trip and serialisation.

``--hidden/--layers`` build a larger reward model in code instead of ``--model``.  Every
side uses one torch thread (the actors get one CPU each, and Ray sets OMP_NUM_THREADS=1 in
them), so the comparison is per core.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from rllib_grpo.models.model_registry import resolve_model  # noqa: E402
from rllib_grpo.rewards.reward_model import SequenceClassifierReward  # noqa: E402


def _pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    prompts = [f"{rng.randint(0, 9)}+{rng.randint(0, 9)}=" for _ in range(n)]
    return prompts, [str(rng.randint(0, 18)) for _ in range(n)]


def _model_folder(args: argparse.Namespace) -> str:
    if not args.hidden:
        return resolve_model(args.model)
    from rllib_grpo.envs.arithmetic import ARITHMETIC_ALPHABET
    from rllib_grpo.models.reward_models import build_tiny_reward_model
    from rllib_grpo.models.tokenizers import build_char_tokenizer

    tokenizer = build_char_tokenizer(ARITHMETIC_ALPHABET)
    model = build_tiny_reward_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers,
                                    num_heads=max(2, args.hidden // 64),
                                    intermediate_size=4 * args.hidden)
    folder = tempfile.mkdtemp(prefix="rm-bench-")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--model", default="builtin:demo-rm")
    parser.add_argument("--hidden", type=int, default=0)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    folder = _model_folder(args)
    prompts, responses = _pairs(args.samples)
    results: dict[str, float | int | str] = {"samples": args.samples, "batch": args.batch,
                                             "workers": args.workers, "model": args.model
                                             if not args.hidden else
                                             f"hidden {args.hidden} x {args.layers} layers"}

    local = SequenceClassifierReward(folder, batch_size=args.batch)
    results["parameters"] = local.num_parameters
    local.score(prompts[:8], responses[:8])  # warm-up
    t0 = time.perf_counter()
    for p, r in zip(prompts, responses, strict=True):
        local.score([p], [r])
    results["in_process_one_at_a_time_samples_per_s"] = args.samples / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    local.score(prompts, responses)
    results["in_process_batched_samples_per_s"] = args.samples / (time.perf_counter() - t0)

    import ray

    from rllib_grpo.rewards.actor_client import ActorPoolReward
    from rllib_grpo.rewards.specs import RewardSpec
    from rllib_grpo.rllib.algorithm.reward_workers import RewardWorker

    ray.init(address="local", num_cpus=max(2, args.workers + 1), include_dashboard=False,
             log_to_driver=False)
    spec = RewardSpec("rm", "model", 1.0, folder)
    names = [f"bench-rm-{i}" for i in range(args.workers)]
    actors = [ray.remote(RewardWorker).options(name=n, num_cpus=1, max_restarts=-1).remote(
        spec, dtype="float32", batch_size=args.batch) for n in names]
    ray.get([a.ready.remote() for a in actors])
    clients = [ActorPoolReward(names, first=i) for i in range(args.workers)]
    batches = [(prompts[i:i + args.batch], responses[i:i + args.batch])
               for i in range(0, args.samples, args.batch)]
    clients[0].score_batch(*batches[0], [None] * len(batches[0][0]))  # warm-up
    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.workers) as pool:
        list(pool.map(lambda job: clients[job[0] % args.workers].score_batch(
            *job[1], [None] * len(job[1][0])), enumerate(batches)))
    results["actor_pool_samples_per_s"] = args.samples / (time.perf_counter() - t0)
    results["actor_calls"] = sum(c.num_calls for c in clients) - 1
    ray.shutdown()
    print(json.dumps(results, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
