"""The learner's forward + backward (and no-grad forward) on SmolLM2-135M's shape: fp32 vs
bf16 autocast, ``token_stats`` 'full' vs 'fused', alternated step by step in ONE process on
the same model, so load drift on a shared machine hits every variant alike.

    python -m benchmarks.learner_alternating [--rounds 4] [--threads 1]

1 torch thread by default; CPU seconds (``time.process_time``) per pass; the first round is
a warm-up and the report gives medians of the others.  `benchmarks.learner_speed` runs
each variant in a fresh process instead (peak memory, AdamW, torch.compile).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from benchmarks.learner_speed import SMOLLM2_SHAPE, _batch

VARIANTS = (("fp32", "full"), ("fp32", "fused"), ("bf16", "full"), ("bf16", "fused"))


def _pass(lm: Any, batch: dict[str, torch.Tensor], dtype: str, mode: str, grad: bool) -> None:
    from rllib_grpo.models.packing import packed_response_log_probs

    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == "bf16")
    with torch.set_grad_enabled(grad), autocast:
        out = packed_response_log_probs(lm, batch, 1.0, True, detach_entropy=True,
                                        token_stats=mode)
    if grad:
        log_probs, mask = out["log_probs"], batch["response_mask"].float()
        ratio = torch.exp(log_probs - log_probs.detach())
        (-(ratio * batch["advantages"] * mask).sum() / mask.sum()).backward()
        lm.zero_grad(set_to_none=True)


def main(argv: list[str] | None = None) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    lm = LlamaForCausalLM(LlamaConfig(**SMOLLM2_SHAPE, attn_implementation="sdpa")).train()
    batch = _batch(32, SMOLLM2_SHAPE["vocab_size"])
    times: dict[tuple[str, str, bool], list[float]] = {}
    for round_ in range(args.rounds):
        for dtype, mode in VARIANTS:
            for grad in (True, False):
                start = time.process_time()
                _pass(lm, batch, dtype, mode, grad)
                times.setdefault((dtype, mode, grad), []).append(time.process_time() - start)
            if round_:
                print(dtype, mode, f"fwd+bwd {times[dtype, mode, True][-1]:.2f} CPU s, "
                      f"no-grad {times[dtype, mode, False][-1]:.2f}", flush=True)
    for dtype, mode in VARIANTS:
        print(f"median {dtype} {mode}: fwd+bwd "
              f"{statistics.median(times[dtype, mode, True][1:]):.2f} CPU s, no-grad "
              f"{statistics.median(times[dtype, mode, False][1:]):.2f}")


if __name__ == "__main__":
    main()
