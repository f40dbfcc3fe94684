"""GPU check of GRPO in bf16 (run by hand; not collected by pytest).

A few GRPO iterations on a randomly initialised model of Qwen2.5-0.5B's shape (24 layers,
hidden 896, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings; the
``llama`` model type, so without Qwen2's q/k/v biases) in bf16 compute over fp32 master
weights, with the transformers sampler on the same GPU:

1. local learner + local env runner: iterations, then a checkpoint saved, restored and
   continued;
2. one remote learner (0.5 GPU) + one remote env runner (0.4 GPU): the same;
3. the same placement one step off policy (``max_staleness=1``, ``rollout_is='token'``):
   the same, and its iterations per minute against phase 2's (``async_vs_sync_throughput``,
   first iteration of each phase left out; docs/async.md).

Per iteration it prints one JSON line: step time, generation time and tokens/s, the update
phase's time, training tokens/s and MFU (matmul FLOPs 6N per trained token, 2N per token of
the old-log-prob and reference passes, over the GPU's dense bf16 peak), weight-sync time and
bytes, and the rollout-vs-trainer log-prob gap.  Per checkpoint: whether the restored learner
(weights and AdamW states) is bit-identical to the saved one, and how far one more iteration
after the restore lands from the uninterrupted run.  It ends with a summary line and exits 1
if a check failed.  Target: under 5 minutes on one GPU.

Needs only torch, transformers and this package with its small dependencies, e.g. from the
offline bundle of ``../shared/gpu/make_bundle.sh`` (no vLLM, no network, no model hub): the
model is built here and saved to a folder, which every Ray worker loads.  Run it from a folder
that does not contain ``rllib_grpo/``::

    python tests/gpu/gpu_grpo_check.py [--iterations 3] [--prompts 16] [--response-length 128]

``--tiny`` runs the same logic on a tiny model on the CPU in about a minute (what the test
suite does, `tests/rllib/learner/test_bf16.py`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from typing import Any

import ray
import torch

QWEN25_05B_SHAPE = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                        num_attention_heads=14, num_key_value_heads=2, vocab_size=151_936,
                        max_position_embeddings=4096, rope_theta=1_000_000.0,
                        tie_word_embeddings=True)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true",
                   help="a tiny model on the CPU: checks the logic where there is no GPU")
    p.add_argument("--iterations", type=int, default=None, help="iterations per phase")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step")
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--response-length", type=int, default=None, help="tokens")
    p.add_argument("--micro-batch", type=int, default=None, help="trajectories per micro-batch")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="the device's dense bf16 peak for MFU (default: from the GPU's name)")
    p.add_argument("--phases", default="local,remote,async",
                   help="comma-separated: local, remote, async (remote, max_staleness=1)")
    p.add_argument("--work-dir", default=None, help="model and checkpoints (default: a temp dir)")
    args = p.parse_args(argv)
    defaults = dict(iterations=2, prompts=4, group_size=4, response_length=8, micro_batch=8) \
        if args.tiny else dict(iterations=3, prompts=16, group_size=8, response_length=128,
                               micro_batch=32)
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


# ----------------------------------------------------------------------------- the model
def build_model_dir(folder: str, tiny: bool) -> tuple[str, int]:
    """Save the random model (bf16 weights) and a character tokenizer covering its
    vocabulary to ``folder``; return it and the parameter count."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rllib_grpo.models import DEFAULT_ALPHABET, build_char_tokenizer, save_model_dir

    if tiny:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                     tie_word_embeddings=True)
        tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
    else:
        shape = dict(QWEN25_05B_SHAPE)
        # One token per character of a wide alphabet: every sampled id decodes.
        tokenizer = build_char_tokenizer(wide_alphabet(shape["vocab_size"] - 4))
    shape["vocab_size"] = len(tokenizer)
    special = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                   pad_token_id=tokenizer.pad_token_id)
    config = AutoConfig.for_model("llama", **shape, **special)
    device = "cuda" if torch.cuda.is_available() and not tiny else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    for key, value in special.items():
        setattr(model.generation_config, key, value)
    save_model_dir(model.cpu(), tokenizer, folder)
    return folder, sum(p.numel() for p in model.parameters())


def wide_alphabet(size: int) -> str:
    """``size`` distinct printable-ish characters, the arithmetic alphabet first."""
    from rllib_grpo.models import DEFAULT_ALPHABET

    chars, code = list(DEFAULT_ALPHABET), 0x100
    while len(chars) < size:
        if not 0xD800 <= code < 0xE000:  # no surrogates
            chars.append(chr(code))
        code += 1
    return "".join(chars)


# ----------------------------------------------------------------------------- config
def grpo_config(args: argparse.Namespace, model_dir: str, remote: bool, gpu: bool) -> Any:
    from rllib_grpo import GRPOConfig

    sampler_config = {"device": "cuda"} if gpu else {}
    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 9})
        .training(model_path=model_dir, model_dtype="bfloat16", sampler="hf",
                  sampler_config=sampler_config, prompts_per_step=args.prompts,
                  group_size=args.group_size, max_prompt_length=16,
                  max_response_length=args.response_length,
                  micro_batch_size_per_learner=args.micro_batch, lr=1e-6)
        .debugging(seed=0)
    )
    if remote:
        config.learners(num_learners=1, num_gpus_per_learner=0.5 if gpu else 0,
                        num_cpus_per_learner=1)
        config.env_runners(num_env_runners=1, num_gpus_per_env_runner=0.4 if gpu else 0,
                           num_cpus_per_env_runner=1, create_local_env_runner=False)
        config.resources(num_cpus_for_main_process=0)
    else:
        config.learners(num_learners=0, num_gpus_per_learner=1 if gpu else 0)
    return config


# ----------------------------------------------------------------------------- measures
def bit_checksums(learner: Any) -> dict[str, tuple[str, int]]:
    """Per tensor of the policy's weights and AdamW states: dtype and the sum of its bit
    patterns as integers (any changed bit changes it), computed where the tensors live."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

    def checksum(t: torch.Tensor) -> tuple[str, int]:
        t = t.detach().contiguous()
        return str(t.dtype), int(t.view(ints[t.element_size()]).to(torch.int64).sum().item())

    lm = learner.module[DEFAULT_MODULE_ID].unwrapped().lm
    out = {f"weight/{k}": checksum(v) for k, v in lm.state_dict().items()}
    for name, optim in learner._named_optimizers.items():
        for index, buffers in optim.state_dict()["state"].items():
            for key, value in buffers.items():
                if torch.is_tensor(value):
                    out[f"optim/{name}/{index}/{key}"] = checksum(value)
    return out


def learner_facts(algo: Any) -> dict[str, Any]:
    """Checksums, master-weight and AdamW-state dtypes of the (local or remote) learner."""
    group = algo.learner_group

    def facts(learner: Any) -> dict[str, Any]:
        sums = bit_checksums(learner)
        dtypes = {kind: sorted({d for k, (d, _) in sums.items() if k.startswith(kind)})
                  for kind in ("weight/", "optim/")}
        return {"checksums": sums, "master_dtypes": dtypes["weight/"],
                "optimizer_dtypes": dtypes["optim/"]}

    return group._get_results(group.foreach_learner(facts))[0]


def learner_weights(algo: Any) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v) for k, v in
            next(iter(algo.learner_group.get_weights().values())).items()}


def max_abs_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k].double() - b[k].double()).abs().max()) for k in a)


def _whole(value: float) -> int | None:
    """``value`` as an int; None for NaN (a runner metric not yet logged)."""
    return None if math.isnan(float(value)) else int(value)


def iteration_row(result: dict[str, Any], step_s: float, num_params: int,
                  uses_reference: bool, peak: float | None) -> dict[str, Any]:
    runners = result.get("env_runners", {})
    tokens = float(result["perf/total_num_tokens"])  # prompt + response tokens trained on
    update_s = float(result["timing_s/update_actor"])
    gen_s = float(runners.get("timing_s/gen", float("nan")))
    response_tokens = float(result["response_length/mean"]) * int(
        runners.get("num_env_steps_sampled", 0))
    flops = tokens * num_params * (6 + 2 + (2 if uses_reference else 0))
    return {
        "step_s": round(step_s, 3), "gen_s": round(gen_s, 3),
        "gen_tokens_per_s": round(response_tokens / gen_s, 1) if gen_s else None,
        "update_s": round(update_s, 3), "train_tokens": int(tokens),
        "train_tokens_per_s": round(tokens / update_s, 1),
        "mfu": round(flops / update_s / peak, 4) if peak else None,
        # (None: no sync this step, e.g. the first one off policy, its runners hold v0)
        "weight_sync_s": round(float(result["timing_s/update_weights"]), 4)
        if "timing_s/update_weights" in result else None,
        "weight_load_s": round(float(runners.get("timing_s/load_weights", float("nan"))), 4),
        "weight_sync_bytes": _whole(runners.get("weight_sync/bytes", 0)),
        "weight_sync_transport": _transport_name(result.get("weight_sync/transport")),
        "rollout_log_probs_diff_max": result.get("training/rollout_log_probs_diff_max"),
        "rollout_probs_diff_mean": result.get("training/rollout_probs_diff_mean"),
    }


def _transport_name(code: float | None) -> str | None:
    """The slowest transport of the step's sync (the ``weight_sync/transport`` metric)."""
    from rllib_grpo.weights.plan import TRANSPORT_CODES

    names = {float(c): name for name, c in TRANSPORT_CODES.items()}
    return None if code is None else names.get(float(code))


def peak_flops(args: argparse.Namespace, gpu: bool) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops * 1e12
    if not gpu:
        return None
    from rllib_grpo.rllib.learner.perf import peak_flops as device_peak_flops

    return device_peak_flops(torch.device("cuda"))  # the learner's table (perf/mfu/actor)


# ----------------------------------------------------------------------------- phases
def run_phase(name: str, args: argparse.Namespace, model_dir: str, num_params: int,
              gpu: bool, work_dir: str) -> dict[str, Any]:
    from ray.rllib.algorithms.algorithm import Algorithm

    config = grpo_config(args, model_dir, remote=name in ("remote", "async"), gpu=gpu)
    if name == "async":
        config.training(max_staleness=1, rollout_is="token")
    peak = peak_flops(args, gpu)
    t0 = time.perf_counter()
    algo = config.build_algo()
    build_s = time.perf_counter() - t0
    rows, step_times = [], []
    try:
        for i in range(args.iterations):
            t0 = time.perf_counter()
            result = algo.train()
            step_times.append(time.perf_counter() - t0)
            rows.append(iteration_row(result, step_times[-1], num_params,
                                      config.needs_reference, peak))
            rows[-1]["staleness_mean"] = result.get("async/staleness_mean")
            print(json.dumps({"phase": name, "iteration": i + 1, **rows[-1]}), flush=True)
        saved = learner_facts(algo)
        path = algo.save_to_path(os.path.join(work_dir, f"ckpt-{name}"))
        algo.train()  # the uninterrupted run, one more iteration
        continued = learner_weights(algo)
    finally:
        algo.stop()  # its GPU share must be free for the restored one
    t0 = time.perf_counter()
    restored = Algorithm.from_checkpoint(path)
    try:
        restore_s = time.perf_counter() - t0
        facts = learner_facts(restored)
        bit_exact = facts["checksums"] == saved["checksums"]
        restored.train()
        after_s = max_abs_diff(learner_weights(restored), continued)
    finally:
        restored.stop()
    steady = step_times[1:] or step_times  # the first iteration warms up (and fills the pipe)
    summary = {"phase": name, "build_s": round(build_s, 1), "restore_s": round(restore_s, 1),
               "iters_per_min": round(60.0 * len(steady) / sum(steady), 2),
               "staleness_max": max((r["staleness_mean"] or 0.0 for r in rows), default=0.0),
               "master_weights": saved["master_dtypes"],
               "optimizer_states": saved["optimizer_dtypes"],
               "checkpoint_bit_exact": bit_exact,
               "continued_vs_uninterrupted_max_diff": after_s}
    print(json.dumps(summary), flush=True)
    return summary


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = torch.cuda.is_available() and not args.tiny
    if not gpu and not args.tiny:
        print("no CUDA GPU: run with --tiny to check the logic on the CPU", file=sys.stderr)
        return 2
    start = time.perf_counter()
    work_dir = args.work_dir or tempfile.mkdtemp(prefix="gpu_grpo_check-")
    model_dir, num_params = build_model_dir(os.path.join(work_dir, "model"), args.tiny)
    print(json.dumps({"device": torch.cuda.get_device_name() if gpu else "cpu",
                      "params": num_params, "model_dir": model_dir,
                      "torch": torch.__version__}), flush=True)
    ray.init(num_cpus=None if gpu else 2, num_gpus=1 if gpu else 0, include_dashboard=False,
             log_to_driver=False, object_store_memory=int((8 if gpu else 0.5) * 2**30))
    try:
        summaries = [run_phase(phase, args, model_dir, num_params, gpu, work_dir)
                     for phase in args.phases.split(",")]
    finally:
        ray.shutdown()
    ok = all(s["checkpoint_bit_exact"] and s["master_weights"] == ["torch.float32"]
             and s["staleness_max"] <= (1 if s["phase"] == "async" else 0) for s in summaries)
    by_phase = {s["phase"]: s for s in summaries}
    speedup = round(by_phase["async"]["iters_per_min"] / by_phase["remote"]["iters_per_min"],
                    3) if {"async", "remote"} <= set(by_phase) else None
    print(json.dumps({"ok": ok, "async_vs_sync_throughput": speedup,
                      "total_s": round(time.perf_counter() - start, 1)}), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
