"""Suite ``learner``: the learner's compute on CPU, variant by variant: forward + log-probs +
entropy, backward, AdamW step (one learner step), and the no-grad reference forward.

    python -m benchmarks learner [--variants fp32,bf16,...] [--threads 1,2]
        [--rounds 3] [--steps 4]

The model has SmolLM2-135M-Instruct's shape (random weights, built in code: vocabulary
49152, 30 layers, hidden 576, tied embeddings) unless ``--tiny``; the batch is the demo's,
packed (`rllib_grpo.models.packing`): 32 sequences of 30-50 prompt tokens and 20-32
response tokens.  Every (variant, threads) runs in a fresh Python process (peak RSS is
that process's), the variants round-robin ``--rounds`` times so load drift hits them alike,
and the report gives each one's median seconds over all its timed steps: wall clock and
the process's CPU time (``time.process_time``; on a shared machine the wall clock of one
thread moves with the other tenants' load, its CPU time much less).

Variants (``VARIANTS``):

* ``fp32``: float32, the unchunked log-softmax over the response logits,
  ``torch.optim.AdamW()`` (its for-loop on CPU; the learner now uses the fused kernel);
* ``bf16``: bf16 autocast over fp32 master weights (the reference in bf16 weights, as
  the learner loads it for ``model_dtype='bfloat16'``);
* ``chunked``: ``token_stats='chunked'`` (`rllib_grpo.models.lm_head`);
* ``fused``: ``token_stats='fused'`` (hidden states in, no full logits);
* ``foreach`` / ``fused_adamw``: AdamW(foreach=True) / AdamW(fused=True);
* ``compile``: ``torch.compile`` of the model (its compile time reported apart);
* combinations joined with ``+`` (``bf16+fused+fused_adamw``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

TITLE = "the learner's step on CPU, variant by variant (SmolLM2-135M's shape)"
DESCRIPTION = """
SmolLM2-135M's shape (random weights), the demo's batch packed (2 272 tokens); a step =
forward + log-probs + entropy, backward, clip, AdamW; the reference pass a no-grad forward.
A fresh process per variant; CPU time is the figure to read on a shared machine.
"""
FEATURES = ("bf16", "chunked", "fused", "foreach", "fused_adamw", "compile", "product")
VARIANTS = ("fp32", "bf16", "chunked", "fused", "foreach", "fused_adamw", "bf16+fused",
            "fused+fused_adamw", "bf16+fused+fused_adamw", "compile")
SMOLLM2_SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                     num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                     max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True,
                     rms_norm_eps=1e-5)
TINY_SHAPE = dict(SMOLLM2_SHAPE, num_hidden_layers=2, vocab_size=4096, hidden_size=64,
                  intermediate_size=128, num_attention_heads=2, num_key_value_heads=1)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks learner",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per variant")
    p.add_argument("--steps", type=int, default=4, help="timed steps per process (after 1)")
    p.add_argument("--sequences", type=int, default=32)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (a smoke test)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # variant:threads, child
    return p.parse_args(argv)


def _batch(sequences: int, vocab: int) -> dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(0)
    prompt_lens = torch.randint(30, 51, (sequences,), generator=gen)
    response_lens = torch.randint(20, 33, (sequences,), generator=gen)
    p, r = int(prompt_lens.max()), int(response_lens.max())
    batch = {
        "prompt_ids": torch.randint(0, vocab, (sequences, p), generator=gen),
        "response_ids": torch.randint(0, vocab, (sequences, r), generator=gen),
        "prompt_mask": (torch.arange(p) >= p - prompt_lens[:, None]).long(),
        "response_mask": (torch.arange(r) < response_lens[:, None]).long(),
    }
    batch["advantages"] = torch.randn(sequences, generator=gen)[:, None].expand(-1, r).contiguous()
    return batch


def _log_probs(lm: Any, batch: dict[str, Any], features: set[str], grad: bool) -> dict[str, Any]:
    """The learner's packed log-prob computation, the variant's way."""
    from rllib_grpo.models.packing import packed_response_log_probs

    mode = "fused" if "fused" in features else "chunked" if "chunked" in features else "full"
    if "product" in features:
        mode = "auto"
    return packed_response_log_probs(lm, batch, 1.0, with_entropy=True, detach_entropy=True,
                                     token_stats=mode)


def run_one(name: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    """One variant in this process: build, one untimed step, ``args.steps`` timed ones."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(threads)
    features = set() if name == "fp32" else set(name.split("+"))
    unknown = features - set(FEATURES)
    if unknown:
        raise SystemExit(f"unknown variant feature(s) {sorted(unknown)}; known: {FEATURES}")
    torch.manual_seed(0)
    shape = TINY_SHAPE if args.tiny else SMOLLM2_SHAPE
    config = LlamaConfig(**shape, attn_implementation="sdpa")
    policy = LlamaForCausalLM(config).float().train()
    reference = LlamaForCausalLM(config).eval().requires_grad_(False)
    reference.load_state_dict(policy.state_dict())
    if "bf16" in features:
        reference = reference.to(torch.bfloat16)
    batch = _batch(args.sequences, int(shape["vocab_size"]))
    optim_kwargs: dict[str, Any] = {"foreach": True} if "foreach" in features else \
        {"fused": True} if "fused_adamw" in features else {}
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.01, **optim_kwargs)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if "bf16" in features \
        else (lambda: torch.autocast("cpu", enabled=False))
    compile_s = 0.0
    if "compile" in features:
        policy.forward = torch.compile(policy.forward, dynamic=True)
    mask = batch["response_mask"].float()

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        with autocast():
            out = _log_probs(policy, batch, features, grad=True)
        log_probs = out["log_probs"]
        ratio = torch.exp(log_probs - log_probs.detach())
        loss = -(ratio * batch["advantages"] * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        return float(loss)

    def reference_pass() -> None:
        with torch.no_grad():
            _log_probs(reference, batch, features, grad=False)

    start = time.perf_counter()
    step()
    first_s = time.perf_counter() - start
    reference_pass()
    step_s, ref_s, step_cpu, ref_cpu = [], [], [], []
    for _ in range(args.steps):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        t1, c1 = time.perf_counter(), time.process_time()
        reference_pass()
        step_s.append(t1 - t0)
        ref_s.append(time.perf_counter() - t1)
        step_cpu.append(c1 - c0)
        ref_cpu.append(time.process_time() - c1)
    if "compile" in features:
        compile_s = first_s - statistics.median(step_s)
    return {"variant": name, "threads": threads, "step_s": step_s, "ref_s": ref_s,
            "step_cpu_s": step_cpu, "ref_cpu_s": ref_cpu,
            "first_step_s": first_s, "compile_s": compile_s,
            "tokens": int(batch["prompt_mask"].sum() + batch["response_mask"].sum()),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def run(argv: list[str]) -> list[dict[str, Any]]:
    """Every (variant, threads) in fresh processes, in rounds; one row per pair."""
    args = parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    thread_counts = [int(t) for t in args.threads.split(",")]
    results: dict[str, dict[str, Any]] = {}
    load = [os.getloadavg()[0]]
    for _ in range(args.rounds):
        for threads in thread_counts:
            for name in variants:
                one = _run_fresh(name, threads, argv)
                print(f"{name}:{threads} step {one['step_s']} cpu {one['step_cpu_s']} "
                      f"ref {one['ref_s']} rss {one['peak_rss_mb']:.0f}", flush=True)
                agg = results.setdefault(f"{name}:{threads}", {
                    "variant": name, "threads": threads, "step_s": [], "ref_s": [],
                    "step_cpu_s": [], "ref_cpu_s": [], "peak_rss_mb": 0.0})
                for k in ("step_s", "ref_s", "step_cpu_s", "ref_cpu_s"):
                    agg[k] += one[k]
                agg["peak_rss_mb"] = max(agg["peak_rss_mb"], one["peak_rss_mb"])
                if "compile" in name.split("+"):
                    agg.setdefault("compile_s", []).append(one["compile_s"])
                load.append(os.getloadavg()[0])
    print(f"load average (1 min) during the run: min {min(load):.2f} max {max(load):.2f}")
    return variant_rows(list(results.values()))


def _run_fresh(name: str, threads: int, argv: list[str]) -> dict[str, Any]:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.learner", *argv,
                           "--one", f"{name}:{threads}"],
                          capture_output=True, text=True, env=env, check=False)
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if proc.returncode or not lines:
        raise SystemExit(f"{name} ({threads} threads) failed:\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def variant_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Medians per (variant, threads), and each step's CPU time over fp32's at its threads."""
    rows = [{"variant": r["variant"], "threads": r["threads"],
             "step CPU s": statistics.median(r["step_cpu_s"]),
             "step wall s": statistics.median(r["step_s"]),
             "reference wall s": statistics.median(r["ref_s"]),
             "peak RSS MB": r["peak_rss_mb"],
             **({"compile s": statistics.median(r["compile_s"])} if "compile_s" in r else {})}
            for r in results]
    fp32 = {row["threads"]: row["step CPU s"] for row in rows if row["variant"] == "fp32"}
    for row in rows:
        row["step CPU / fp32"] = (row["step CPU s"] / fp32[row["threads"]]
                                  if row["threads"] in fp32 else None)
    return rows


def main(argv: list[str] | None = None) -> None:
    """A child process's entry point (``--one VARIANT:THREADS``)."""
    args = parse_args(argv)
    if not args.one:
        raise SystemExit("run the suite as `python -m benchmarks learner [options]`")
    name, threads = args.one.rsplit(":", 1)
    print("RESULT " + json.dumps(run_one(name, int(threads), args)), flush=True)


if __name__ == "__main__":
    main()
