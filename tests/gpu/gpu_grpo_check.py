"""GPU check (run by hand on a CUDA machine with `vllm` installed; not collected by pytest).

A few GRPO iterations with the vLLM sampler on a randomly initialised model of
Qwen2.5-0.5B's shape (24 layers, hidden 896, 14 heads / 2 KV heads, vocab 151,936),
learner and engine colocated on one GPU.  Prints generation tokens/s, weight-sync
time and step time.

    python tests/gpu/gpu_grpo_check.py [--iterations 5] [--response-length 256]
"""

from __future__ import annotations

import argparse
import json
import time

import ray
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from rllib_grpo import GRPOConfig
from rllib_grpo.models import build_char_tokenizer, register_builtin_model
from rllib_grpo.rllib.weight_sync_plan import TRANSPORT_NAMES

QWEN25_05B_SHAPE = dict(
    hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
    num_key_value_heads=2, vocab_size=151936, max_position_embeddings=4096,
    tie_word_embeddings=True, rope_theta=1_000_000.0,
)


def build_qwen05b_shaped(seed: int = 0):
    tokenizer = build_char_tokenizer("0123456789+-*=")
    torch.manual_seed(seed)
    config = Qwen2Config(**QWEN25_05B_SHAPE, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return Qwen2ForCausalLM(config).to(torch.bfloat16), tokenizer


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=256)
    args = parser.parse_args()
    assert torch.cuda.is_available(), "this check needs a CUDA GPU"

    register_builtin_model("builtin:qwen05b-shape", build_qwen05b_shaped, params={"seed": 0})
    ray.init(num_gpus=1)
    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 9})
        .training(model_path="builtin:qwen05b-shape", model_dtype="bfloat16", sampler="vllm",
                  prompts_per_step=args.prompts, group_size=args.group_size,
                  prompts_per_minibatch=args.prompts // 2, micro_batch_size_per_learner=64,
                  max_prompt_length=16, max_response_length=args.response_length,
                  sampler_config={"gpu_memory_utilization": 0.3, "dtype": "bfloat16"},
                  lr=1e-6)
        .learners(num_learners=0, num_gpus_per_learner=1)
    )
    algo = config.build_algo()
    rows = []
    for _ in range(args.iterations):
        t0 = time.perf_counter()
        r = algo.train()
        step = time.perf_counter() - t0
        gen = r["env_runners"]["timing_s/gen"]
        tokens = r["response_length/mean"] * args.prompts * args.group_size
        rows.append({"step_s": step, "gen_s": gen, "gen_tokens_per_s": tokens / gen,
                     "update_actor_s": r["timing_s/update_actor"],
                     "update_weights_s": r["timing_s/update_weights"],
                     "weight_bytes": r["env_runners"].get("weight_sync/bytes"),
                     "weight_sync_transport": TRANSPORT_NAMES.get(
                         int(r.get("weight_sync/transport", -1))),
                     "rollout_log_probs_diff_max": r.get("training/rollout_log_probs_diff_max")})
        print(json.dumps(rows[-1]), flush=True)
    algo.stop()


if __name__ == "__main__":
    main()
