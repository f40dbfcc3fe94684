"""How fast a GRPO step of `benchmarks.trl_side_by_side`'s 5.7M model can be on this CPU.

    python -m benchmarks.learner_floor [--threads 1] [--dtype float32|bfloat16] [--reps 5]

Both systems do the same arithmetic per step: sample ``prompts x group_size`` responses of
``max_new_tokens`` tokens, then one forward and backward over every prompt + response token
and an AdamW step.  This prints, in one process:

* the matmul rate of this CPU at the model's shapes (``tokens x hidden`` by
  ``hidden x {q, k, v, o, gate, up, down}``), the best a step's linear layers can do;
* the floating-point work of one step (2 FLOPs per parameter per token forward, twice that
  backward; the decode steps' forwards), and so the time of a step at that rate;
* the plain transformers loop: ``model(ids)`` on the padded batch, log-softmax of the
  response tokens, a loss, ``backward()`` and fused AdamW (what any GRPO learner must do
  at least), and ``generate`` of the same responses.

The step of a system cannot beat the floor; a ratio to TRL's step below the plain loop's
over TRL's needs less arithmetic (precision) or other resources (more cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.trl_runs import SideBySideSpec


def median_time(fn: Callable[[], Any], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(tokens: int, shapes: list[tuple[int, int]], dtype: torch.dtype,
                reps: int) -> float:
    """FLOP/s of ``(tokens x k) @ (k x n)`` summed over ``shapes``."""
    pairs = [(torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype))
             for k, n in shapes]
    flops = sum(2 * tokens * k * n for k, n in shapes)
    return flops / median_time(lambda: [a @ b for a, b in pairs], reps)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    from transformers import AutoModelForCausalLM

    from benchmarks.workloads import prepare_model

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    spec = SideBySideSpec()
    model = AutoModelForCausalLM.from_pretrained(
        prepare_model("builtin:qwen2-5m7", fixed_length=True), dtype=torch.float32)
    cfg = model.config
    rows, prompt = spec.prompts * spec.group_size, 4  # "3+4=" is 4 characters
    length = prompt + spec.max_new_tokens
    hidden = cfg.hidden_size
    kv = cfg.num_key_value_heads * (hidden // cfg.num_attention_heads)
    shapes = [(hidden, hidden), (hidden, kv), (hidden, kv), (hidden, hidden),
              (hidden, cfg.intermediate_size), (hidden, cfg.intermediate_size),
              (cfg.intermediate_size, hidden)]
    dtype = getattr(torch, args.dtype)
    rate = matmul_rate(rows * length, shapes, dtype, args.reps)
    decode_rate = matmul_rate(rows, shapes, dtype, args.reps)
    params = sum(p.numel() for n, p in model.named_parameters() if "embed" not in n)
    train_flops = 3 * 2 * params * rows * length  # forward + backward (2x forward)
    decode_flops = 2 * params * rows * spec.max_new_tokens

    ids = torch.randint(4, cfg.vocab_size, (rows, length))
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr, fused=True)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16)

    def learner_step() -> None:
        with autocast:
            logits = model(input_ids=ids).logits[:, prompt - 1 : -1].float()
        log_probs = logits.log_softmax(-1).gather(-1, ids[:, prompt:, None]).squeeze(-1)
        (-(log_probs * torch.randn_like(log_probs)).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()

    def generate() -> None:
        with torch.no_grad(), autocast:
            model.generate(input_ids=ids[:, :prompt], attention_mask=torch.ones_like(
                ids[:, :prompt]), do_sample=True, top_k=0, max_new_tokens=spec.max_new_tokens,
                min_new_tokens=spec.max_new_tokens, pad_token_id=0)

    report = {
        "threads": args.threads, "dtype": args.dtype, "params_without_embeddings": params,
        "matmul_gflops_train_shapes": rate / 1e9, "matmul_gflops_decode_shapes": decode_rate / 1e9,
        "train_gflop": train_flops / 1e9, "decode_gflop": decode_flops / 1e9,
        "floor_learner_s": train_flops / rate, "floor_decode_s": decode_flops / decode_rate,
        "plain_learner_s": median_time(learner_step, args.reps),
        "plain_generate_s": median_time(generate, args.reps),
    }
    report["floor_step_s"] = report["floor_learner_s"] + report["floor_decode_s"]
    report["plain_step_s"] = report["plain_learner_s"] + report["plain_generate_s"]
    for key, value in report.items():
        print(f"{key:32s} {value:.4g}" if isinstance(value, float) else f"{key:32s} {value}")
    if args.json:
        with open(args.json, "w") as file:
            json.dump(report, file, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
