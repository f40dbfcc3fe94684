"""Per-learner memory and update time: 1 plain learner vs 2 FSDP2 learners.

    python benchmarks/fsdp_memory.py [--out benchmarks/results/fsdp_memory.json] [--iters 5]

Builds an 11.5M-parameter llama (``builtin:llama-11m``: hidden 256, 8 layers, 8 heads
of 32, MLP 1536, char vocabulary; ``builtin:10m`` of `benchmarks.workloads` has 9.8M),
runs GRPO updates on a synthetic batch with each learner group, and reports the
bytes each learner holds in its local shards of the policy parameters, their
gradients and Adam's two moments (the reference model, also sharded, is listed
apart), plus the mean time of one update.
CPU-only by default (gloo, one core per learner).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import ray  # noqa: E402
from ray.rllib.core import DEFAULT_MODULE_ID  # noqa: E402
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch  # noqa: E402

from rllib_grpo.models import (  # noqa: E402
    DEFAULT_ALPHABET,
    build_char_tokenizer,
    build_tiny_causal_lm,
    register_builtin_model,
    resolve_model,
)
from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE, GRPOConfig  # noqa: E402

MODEL_PARAMS = {"hidden_size": 256, "num_layers": 8, "num_heads": 8, "num_kv_heads": 8,
                "intermediate_size": 1536, "max_position_embeddings": 128, "seed": 0}
PROMPTS, GROUP, PROMPT_LEN, RESPONSE_LEN = 8, 4, 32, 32


def _build_llama_11m(**params: Any):
    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
    return build_tiny_causal_lm(tokenizer, arch="llama", **params), tokenizer


def _synthetic_batch(vocab: int, seed: int = 0) -> MultiAgentBatch:
    """PROMPTS groups of GROUP responses with random tokens and lengths."""
    rng = np.random.default_rng(seed)
    n = PROMPTS * GROUP
    prompt_ids = np.zeros((n, PROMPT_LEN), np.int64)
    prompt_mask = np.zeros((n, PROMPT_LEN), np.int64)
    response_ids = np.zeros((n, RESPONSE_LEN), np.int64)
    response_mask = np.zeros((n, RESPONSE_LEN), np.float32)
    for i in range(n):
        p_len, r_len = rng.integers(PROMPT_LEN // 2, PROMPT_LEN + 1), rng.integers(
            RESPONSE_LEN // 4, RESPONSE_LEN + 1)
        prompt_ids[i, PROMPT_LEN - p_len:] = rng.integers(4, vocab, p_len)
        prompt_mask[i, PROMPT_LEN - p_len:] = 1
        response_ids[i, :r_len] = rng.integers(4, vocab, r_len)
        response_mask[i, :r_len] = 1
    columns = {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "response_ids": response_ids,
        "response_mask": response_mask, "rollout_log_probs": np.zeros_like(response_mask),
        "scores": rng.integers(0, 2, n).astype(np.float32),
        "group_index": np.repeat(np.arange(PROMPTS), GROUP),
        "truncated": np.zeros(n, bool),
        "reward_baselines": np.zeros(n, np.float32),
    }
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=n)


def learner_memory(learner: Any) -> dict[str, int]:
    """Bytes of the local shards this learner holds (runs inside the learner actor)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    def local_bytes(tensors) -> int:
        locals_ = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
        return sum(t.numel() * t.element_size() for t in locals_ if t is not None)

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    params = [p for p in module.lm.parameters()]
    moments = [v for optim in learner._named_optimizers.values() for state in optim.state.values()
               for key, v in state.items() if key != "step" and torch.is_tensor(v)]
    return {
        "rank": dist.get_rank() if dist.is_initialized() else 0,
        "param_bytes": local_bytes(params),
        "grad_bytes": local_bytes(p.grad for p in params),
        "adam_bytes": local_bytes(moments),
        "reference_bytes": local_bytes(module.ref_lm.parameters()) if module.ref_lm else 0,
    }


def _config(model_path: str, num_learners: int) -> GRPOConfig:
    config = GRPOConfig().training(
        model_path=model_path, prompts_per_step=PROMPTS, group_size=GROUP,
        max_prompt_length=PROMPT_LEN, max_response_length=RESPONSE_LEN, lr=1e-5,
        micro_batch_size_per_learner=8)
    config.learners(num_learners=num_learners, num_cpus_per_learner=1)
    config.resources(num_cpus_for_main_process=0)
    config.validate()
    return config


def measure(model_path: str, num_learners: int, iters: int) -> dict[str, Any]:
    """Start a learner group, update ``iters`` + 1 times (the first is warm-up), measure."""
    group = _config(model_path, num_learners).build_learner_group(
        spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    try:
        vocab = len(group.get_weights()[DEFAULT_MODULE_ID]["model.embed_tokens.weight"])
        batch = _synthetic_batch(vocab)
        times = []
        for i in range(iters + 1):
            start = time.perf_counter()
            group.update(batch=batch)
            if i:
                times.append(time.perf_counter() - start)
        per_learner = sorted(group._get_results(group.foreach_learner(learner_memory)),
                             key=lambda m: m["rank"])
    finally:
        group.shutdown()
    # Other work on the machine skews the times (2 learners need both cores at once).
    return {"num_learners": num_learners, "update_s_mean": statistics.mean(times),
            "update_s": times, "load_avg_1min": os.getloadavg()[0],
            "per_learner": per_learner}


def _table(results: list[dict[str, Any]], num_params: int) -> str:
    mib = 1024 ** 2
    lines = [f"model: {num_params / 1e6:.2f}M parameters (fp32); batch {PROMPTS}x{GROUP} "
             f"trajectories, <= {PROMPT_LEN}+{RESPONSE_LEN} tokens",
             "learners | rank | params MiB | grads MiB | Adam MiB | params+Adam MiB | "
             "reference MiB | update s | load"]
    for result in results:
        for m in result["per_learner"]:
            lines.append(
                f"{result['num_learners']:8d} | {m['rank']:4d} | {m['param_bytes'] / mib:10.2f} | "
                f"{m['grad_bytes'] / mib:9.2f} | {m['adam_bytes'] / mib:8.2f} | "
                f"{(m['param_bytes'] + m['adam_bytes']) / mib:15.2f} | "
                f"{m['reference_bytes'] / mib:13.2f} | {result['update_s_mean']:8.2f} | "
                f"{result['load_avg_1min']:4.1f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/results/fsdp_memory.json")
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()

    register_builtin_model("builtin:llama-11m", _build_llama_11m, params=MODEL_PARAMS)
    # Learner actors don't know this name: hand them the built folder.
    model_path = resolve_model("builtin:llama-11m")
    from rllib_grpo.models import load_causal_lm

    num_params = sum(p.numel() for p in load_causal_lm(model_path).parameters())
    assert num_params >= 10_000_000, num_params

    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    try:
        results = [measure(model_path, n, args.iters) for n in (1, 2)]
    finally:
        ray.shutdown()
    print(_table(results, num_params))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(
        {"model": {"name": "builtin:llama-11m", "num_params": num_params, **MODEL_PARAMS},
         "batch": {"prompts": PROMPTS, "group_size": GROUP, "max_prompt_length": PROMPT_LEN,
                   "max_response_length": RESPONSE_LEN},
         "results": results}, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
