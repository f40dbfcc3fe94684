#!/usr/bin/env python
"""One-GPU check of rllib-grpo's GPU code paths, without Ray or vLLM (<= 6 min on one H100).

Run from the repository root (nothing to install; the image's CUDA torch and transformers do):

    PYTHONPATH=. PYTHONUNBUFFERED=1 OUT=/tmp/out python tests/gpu/gpu_review_check.py [--only c12] [--no-big]

One JSON line per check (``ok``: the code behaved as a correct GPU path must; ``finding``:
what the review predicted, ``observed``: what happened); also appended to
``$OUT/gpu_review.jsonl`` when ``OUT`` is set.  Multi-process checks run in spawned children
with a timeout, so a hang costs at most that timeout.  On a machine without a GPU it is its
own dry run: every check that can runs on the CPU at toy sizes, the GPU-only ones say
"skipped" (``python tests/gpu/gpu_review_check.py``).

c12 is the headline layout: an engine's share of the GPU held by another process beside the
learner, through build, update and the engine's wake-up, with the memory plan's prediction
beside each peak.  c13 runs one ``colocate(1)`` step through vLLM's ``ipc`` engine; it needs
Ray and vLLM and says "skipped" in one line where they are missing.
"""

from __future__ import annotations

import argparse
import importlib.util as _iu  # noqa: E402
import json
import os
import socket
import sys
import tempfile
import time
import traceback

PRESENT = {n: _iu.find_spec(n) is not None for n in ("ray", "vllm", "flash_attn")}
if "--colocate-child" not in sys.argv:  # (c13's own interpreter needs them)
    for _blocked in ("ray", "gymnasium", "vllm", "tensorboardX"):  # never needed here
        sys.modules.setdefault(_blocked, None)  # type: ignore[arg-type]

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

GPU = torch.cuda.is_available()
DEV = torch.device("cuda" if GPU else "cpu")
RESULTS: list[dict] = []
T0 = time.perf_counter()


def record(name: str, ok: bool | None, **detail) -> None:
    row = {"check": name, "ok": ok, "t": round(time.perf_counter() - T0, 1), **detail}
    RESULTS.append(row)
    print(json.dumps(row, default=str), flush=True)
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gpu_review.jsonl"), "a") as f:
            f.write(json.dumps(row, default=str) + "\n")


def guarded(name: str, fn, *args) -> None:
    t = time.perf_counter()
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001
        record(name, False, error=f"{type(error).__name__}: {error}"[:600],
               tb=traceback.format_exc()[-1500:], seconds=round(time.perf_counter() - t, 1))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ----------------------------------------------------------------------------- fixtures
def model_dir(root: str, name: str, **shape) -> str:
    """A random llama-type model saved with a char tokenizer (no hub)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rllib_grpo.models import DEFAULT_ALPHABET, build_char_tokenizer, save_model_dir

    path = os.path.join(root, name)
    if os.path.exists(path):
        return path
    tok = build_char_tokenizer(DEFAULT_ALPHABET)
    cfg = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=2, vocab_size=4096,
               max_position_embeddings=1024, tie_word_embeddings=True,
               initializer_range=0.1)  # sharp enough that cross-sequence attention shows
    cfg.update(shape)
    config = AutoConfig.for_model("llama", bos_token_id=tok.bos_token_id,
                                  eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                                  **cfg)
    torch.manual_seed(0)
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    save_model_dir(model.cpu(), tok, path)
    return path


def q05b_dir(root: str) -> str:
    """Qwen2.5-0.5B's shape (llama type, tied embeddings), random weights."""
    return model_dir(root, "q05b", hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                     num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
                     max_position_embeddings=4096, initializer_range=0.02)


def make_batch(b: int, p: int, r: int, vocab: int, device, seed: int = 0,
               full: bool = False) -> dict:
    """``b`` rows of random tokens, prompts left-padded to ``p``, responses right-padded to
    ``r``; random lengths, or every row at full length (``full``)."""
    g = torch.Generator().manual_seed(seed)
    prompt_len = torch.full((b,), p) if full else torch.randint(1, p + 1, (b,), generator=g)
    resp_len = torch.full((b,), r) if full else torch.randint(1, r + 1, (b,), generator=g)
    prompt_ids = torch.randint(3, vocab, (b, p), generator=g)
    response_ids = torch.randint(3, vocab, (b, r), generator=g)
    prompt_mask = (torch.arange(p)[None] >= (p - prompt_len)[:, None]).long()  # left pad
    response_mask = (torch.arange(r)[None] < resp_len[:, None]).long()       # right pad
    prompt_ids = prompt_ids * prompt_mask
    response_ids = response_ids * response_mask
    return {k: v.to(device) for k, v in dict(prompt_ids=prompt_ids, prompt_mask=prompt_mask,
                                             response_ids=response_ids,
                                             response_mask=response_mask).items()}


def padded_log_probs(lm, batch, temperature=1.0):
    """rllib_grpo.rllib.learner.module.response_log_probs (padded branch), inlined (module.py imports Ray)."""
    from rllib_grpo.algos import logprobs_from_logits

    p = batch["prompt_ids"].shape[1]
    ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], 1).long()
    mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], 1).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
    return logprobs_from_logits(logits[:, p - 1:-1].float() / temperature,
                                batch["response_ids"].long())


def masked_max_diff(a, b, mask) -> float:
    return float(((a - b).abs() * mask).max())


# ----------------------------------------------------------------------------- checks
def c0_env(_root):
    import transformers

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "gpu": GPU,
            "transformers": transformers.__version__, "present": PRESENT,
            "flash_attn": _flash_ok()}
    if GPU:
        nccl = torch.cuda.nccl.version()
        info.update(name=torch.cuda.get_device_name(),
                    nccl=".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl),
                    allow_tf32=torch.backends.cuda.matmul.allow_tf32,
                    alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
                    uuid=str(torch.cuda.get_device_properties(0).uuid))
    record("c0_env", True, **info)


def _flash_ok() -> str:
    import importlib.util as u

    if u.find_spec("flash_attn") is None:
        return "absent"
    try:
        from flash_attn import flash_attn_varlen_func  # noqa: F401
        return "importable"
    except Exception as e:  # noqa: BLE001  (installed but broken: prefer_varlen_attention still switches)
        return f"find_spec ok but import fails: {type(e).__name__}: {e}"[:200]


def c1_perf(_root):
    from rllib_grpo.rllib.learner.perf import PhaseTimes, peak_flops

    if not GPU:
        return record("c1_perf", None, skipped="no GPU")
    name = torch.cuda.get_device_name()
    peak = peak_flops(DEV)
    pt = PhaseTimes(DEV)
    pt.reset()
    with pt.phase("x", 10):
        torch.randn(4096, 4096, device=DEV) @ torch.randn(4096, 4096, device=DEV)
    record("c1_perf", peak is not None, device=name, peak_tflops=(peak or 0) / 1e12,
           phase_s=round(pt.seconds["x"], 4),
           note="dense bf16 peaks: H100/H200 SXM 989, H100 PCIe 756 (perf.py tells them apart)")


def c2_packing(root):
    """Packed (padding-free) log-probs == padded ones on the device, fp32 and bf16 autocast;
    gradients finite; FA2 varlen path if flash_attn imports."""
    from rllib_grpo.models.loading import load_causal_lm
    from rllib_grpo.models.packing import (
        attention_implementation,
        packed_response_log_probs,
        prefer_varlen_attention,
        uses_varlen_attention,
    )
    from rllib_grpo.models.precision import compute_autocast

    path = model_dir(root, "small")
    lm = load_causal_lm(path, dtype="float32").to(DEV)
    batch = make_batch(16 if GPU else 4, 24, 40, 4096, DEV)
    mask = batch["response_mask"].float()
    with torch.no_grad():
        fp32_packed = packed_response_log_probs(lm, batch, 1.0)["log_probs"]
        fp32_padded = padded_log_probs(lm, batch)
        with compute_autocast(torch.float32, "bfloat16", DEV.type):
            bf_packed = packed_response_log_probs(lm, batch, 1.0)["log_probs"]
            bf_padded = padded_log_probs(lm, batch)
    with compute_autocast(torch.float32, "bfloat16", DEV.type):
        out = packed_response_log_probs(lm, batch, 1.0, with_entropy=True)
        loss = -(out["log_probs"] * mask).sum() / mask.sum() - 0.01 * (out["entropy"] * mask).mean()
    loss.backward()
    gnorm = float(torch.nn.utils.clip_grad_norm_(lm.parameters(), 1e9))
    detail = dict(attn=attention_implementation(lm),
                  fp32_packed_vs_padded=masked_max_diff(fp32_packed, fp32_padded, mask),
                  bf16_packed_vs_padded=masked_max_diff(bf_packed, bf_padded, mask),
                  bf16_vs_fp32=masked_max_diff(bf_packed, fp32_padded, mask),
                  grad_norm=gnorm)
    ok = detail["fp32_packed_vs_padded"] < 2e-3 and detail["bf16_packed_vs_padded"] < 0.15 \
        and torch.isfinite(torch.tensor(gnorm)).item()
    # flash-attention varlen (one row per micro-batch): only where flash_attn imports.
    if GPU and _flash_ok() == "importable":
        switched = prefer_varlen_attention(lm, DEV, "bfloat16")
        with torch.no_grad(), compute_autocast(torch.float32, "bfloat16", DEV.type):
            fa_packed = packed_response_log_probs(lm, batch, 1.0)["log_probs"]
        detail.update(fa2_switched=switched, fa2_attn=attention_implementation(lm),
                      fa2_packed_vs_sdpa_padded=masked_max_diff(fa_packed, bf_padded, mask),
                      varlen=uses_varlen_attention(lm))
        ok = ok and detail["fa2_packed_vs_sdpa_padded"] < 0.15
    else:
        detail["fa2"] = f"not run: flash_attn {_flash_ok()}"
    record("c2_packing", ok, **detail)


def c3_sampler(root):
    """The transformers sampler on the GPU; its default device; scores memory."""
    from rllib_grpo.samplers import SamplingParams, make_sampler
    from rllib_grpo.samplers.hf import HFSampler
    from tests.helpers.log_probs import max_log_prob_diff

    path = model_dir(root, "small")
    # As TextEnvRunner builds it with sampler="auto" and no sampler_config (vLLM blocked here,
    # as when its wheel does not import against this torch).
    default = make_sampler("auto", model_path=path, dtype="bfloat16", gpu_memory_utilization=0.45)
    default_device = str(default.device)
    default.close()
    s = HFSampler(path, dtype="bfloat16", device=DEV)
    prompts = [[5 + (i * 7 + j) % 11 for j in range(12)] for i in range(16 if GPU else 2)]
    params = SamplingParams(temperature=1.0, max_tokens=64 if GPU else 8)
    if GPU:
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    groups = s.generate(prompts, 8 if GPU else 2, params)
    gen_s = time.perf_counter() - t
    diff = max_log_prob_diff(s.model, prompts[:2], groups[:2], params)
    peak = torch.cuda.max_memory_allocated() / 2**30 if GPU else 0.0
    record("c3_sampler", diff < 0.5 and default_device.startswith(DEV.type),
           default_device_without_sampler_config=default_device,
           finding="the HF sampler computes on the process's GPU without sampler_config",
           gen_s=round(gen_s, 2), max_logprob_diff_bf16=round(diff, 4), peak_gib=round(peak, 2),
           tokens=sum(len(x.token_ids) for g in groups for x in g))


# -- weight sync ---------------------------------------------------------------
# No c4, c4b, c5, c7 or c8: CUDA IPC and NCCL weight transfer are vLLM's engines (c13 runs a
# colocated step through vLLM's ipc engine), and what the planner gives a LoRA payload or
# two ranks on one GPU is checked on CPU (tests/weights/test_weight_sync_plan.py).


def _shm_reader(path, manifest, q_out):
    try:
        import torch as t

        from rllib_grpo.weights.shm import SharedWeights

        reader = SharedWeights.open(path, manifest.nbytes)
        dev = "cuda" if t.cuda.is_available() else "cpu"
        sums = {name: float(view.to(dev).double().sum())
                for name, view in reader.read(manifest, stamp=1).items()}
        reader.check_unchanged(stamp=1)
        q_out.put(("sums", sums))
    except Exception as e:  # noqa: BLE001
        q_out.put(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-800:]}"))


def c6_shm(_root):
    """The host path with CUDA sources (fp32 -> bf16, cast while copying into the shared
    file) and a reader process that loads the views onto its GPU."""
    from rllib_grpo.weights.shm import SharedWeights, plan_manifest, split_aliases

    torch.manual_seed(1)
    hidden = 1024 if GPU else 64
    emb = torch.randn(8192, hidden, device=DEV)
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": emb}
    for i in range(8 if GPU else 2):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.randn(4 * hidden, hidden,
                                                                       device=DEV)
    unique, aliases = split_aliases(tensors)
    manifest = plan_manifest(unique, wire_dtype=torch.bfloat16, aliases=aliases)
    shared = SharedWeights.create(manifest.nbytes)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    try:
        t = time.perf_counter()
        shared.write(manifest, unique.__getitem__, stamp=1)
        write_s = time.perf_counter() - t
        kid = ctx.Process(target=_shm_reader, args=(shared.path, manifest, q), daemon=True)
        kid.start()
        kind, sums = q.get(timeout=120)
        kid.join(timeout=15)
        expected = {k: float(v.to(torch.bfloat16).double().sum()) for k, v in tensors.items()}
        ok = kind == "sums" and set(sums) == set(expected) and all(
            abs(sums[k] - expected[k]) < 1e-3 for k in expected)
        record("c6_shm", ok, write_s=round(write_s, 3), gbytes=manifest.nbytes / 1e9,
               error=None if kind == "sums" else sums)
    finally:
        shared.close(remove=True)


# -- FSDP2 on CUDA (one rank) --------------------------------------------------
def _fsdp_child(path, port, q_out):
    rows = {}
    try:
        import torch as t
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
        from torch.distributed.tensor import DTensor

        from rllib_grpo.models.loading import load_causal_lm
        from rllib_grpo.models.packing import packed_response_log_probs
        from rllib_grpo.rllib.learner import distributed as D

        cuda = t.cuda.is_available()
        dev = "cuda" if cuda else "cpu"  # CPU/gloo: a dry run of this check
        if cuda:
            t.cuda.set_device(0)
        # The learners' backend under fsdp_cpu_offload on GPUs (`rllib_grpo.rllib.placement.
        # learners_backend`, which imports Ray): host shards' collectives go over gloo.
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                rank=0, world_size=1,
                                **({"device_id": t.device("cuda", 0)} if cuda else {}))
        rows["backend"] = dist.get_backend()
        mesh = init_device_mesh(dev, (1,))
        mp_policy = MixedPrecisionPolicy(param_dtype=t.bfloat16, reduce_dtype=t.float32)
        batch = make_batch(8, 16, 32, 4096, dev)
        mask = batch["response_mask"].float()

        def step(offload):
            lm = load_causal_lm(path, dtype="float32").to(dev)
            D.shard_causal_lm(lm, mesh, mp_policy, offload)
            opt = t.optim.AdamW(lm.parameters(), lr=1e-4)
            out = packed_response_log_probs(lm, batch, 1.0, with_entropy=True)
            (-(out["log_probs"] * mask).sum() / mask.sum()).backward()
            params = [p for p in lm.parameters() if p.grad is not None]
            norm = t.nn.utils.clip_grad_norm_(params, 1.0)
            norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
            opt.step()
            return lm, opt, float(norm)

        lm, opt, norm = step(OffloadPolicy())
        rows["gpu_step_grad_norm"] = norm
        sd = D.gather_full_state_dict(lm)
        rows["full_state_dtypes"] = sorted({str(v.dtype) for v in sd.values()})
        rows["full_state_devices"] = sorted({str(v.device) for v in sd.values()})
        D.load_full_state_dict(lm, sd)
        osd = D.full_optimizer_state(lm, opt)
        D.load_full_optimizer_state(lm, opt, osd)
        rows["state_roundtrip"] = "ok"
        lm.set_attn_implementation("eager")  # FSDP-wrapped class: the call prefer_varlen_attention makes
        lm.set_attn_implementation("sdpa")
        rows["set_attn_on_fsdp_class"] = "ok"
        try:
            _, _, norm2 = step(CPUOffloadPolicy(pin_memory=cuda))
            rows["cpu_offload_step"] = f"ok, grad norm {norm2:.4g}"
        except Exception as e:  # noqa: BLE001
            rows["cpu_offload_step"] = f"{type(e).__name__}: {e}"[:300]
        dist.destroy_process_group()
        q_out.put(("ok", rows))
    except Exception as e:  # noqa: BLE001
        q_out.put(("error", {**rows, "error": f"{type(e).__name__}: {e}",
                             "tb": traceback.format_exc()[-1200:]}))


def c9_fsdp(root):
    path = model_dir(root, "small")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    child = ctx.Process(target=_fsdp_child, args=(path, free_port(), q), daemon=True)
    child.start()
    try:
        kind, rows = q.get(timeout=200)
        record("c9_fsdp", kind == "ok", **rows,
               finding="fsdp_cpu_offload with an NCCL-only default group: clip_grad_norm_ of CPU "
                       "DTensor grads needs a cpu:gloo backend ('No backend type associated with "
                       "device type cpu'); fixed by the learners' cpu:gloo,cuda:nccl backend "
                       "(learners_backend): cpu_offload_step reads ok")
    finally:
        child.join(timeout=20)
        if child.is_alive():
            child.kill()


def c10_offload(root):
    if not GPU:
        return record("c10_offload", None, skipped="no GPU")
    from rllib_grpo.models.loading import load_causal_lm
    from rllib_grpo.models.offload import HostOffloaded, offload_optimizer_states

    torch.manual_seed(0)
    a, b = (torch.nn.Parameter(torch.randn(1 << 20, device=DEV)) for _ in range(2))
    b.data.copy_(a.data)
    oa, ob = torch.optim.AdamW([a], lr=1e-3), torch.optim.AdamW([b], lr=1e-3)
    offload_optimizer_states(ob)
    for _step in range(3):
        g = torch.randn(1 << 20, device=DEV)
        a.grad, b.grad = g.clone(), g.clone()
        oa.step()
        ob.step()
    state = ob.state[b]
    same = bool(torch.equal(a, b))
    path = q05b_dir(root)
    ref = HostOffloaded(load_causal_lm(path, dtype="bfloat16"))
    nbytes = sum(p.numel() * p.element_size() for p in ref.model.parameters())
    torch.cuda.synchronize()
    t = time.perf_counter()
    with ref.on(DEV):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    record("c10_offload", same, optimizer_offload_bit_equal=same,
           exp_avg_device=str(state["exp_avg"].device), exp_avg_pinned=state["exp_avg"].is_pinned(),
           ref_offload_gb=round(nbytes / 1e9, 2), ref_round_trip_s=round(seconds, 3),
           ref_pinned=next(ref.model.parameters()).is_pinned(),
           finding="one learner's host-offloaded reference visits the GPU once per pass, "
                   "from pinned memory (under FSDP its shards stay in host memory instead)")


def c11_throughput(root):
    """fp32 vs bf16 autocast over fp32 master weights (the GPU default, ``model_dtype="auto"``):
    one micro-batch fwd+bwd of a 0.5B shape."""
    if not GPU:
        return record("c11_throughput", None, skipped="no GPU")
    from rllib_grpo.models.loading import load_causal_lm
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.models.precision import compute_autocast

    path = q05b_dir(root)
    lm = load_causal_lm(path, dtype="float32").to(DEV)
    n = sum(p.numel() for p in lm.parameters())
    batch = make_batch(32, 64, 256, 151936, DEV)
    mask = batch["response_mask"].float()
    tokens = float(batch["prompt_mask"].sum() + batch["response_mask"].sum())
    out = {}
    for label, dtype in (("fp32", "float32"), ("bf16_autocast", "bfloat16")):
        times = []
        torch.cuda.reset_peak_memory_stats()
        for _ in range(3):
            torch.cuda.synchronize()
            t = time.perf_counter()
            with compute_autocast(torch.float32, dtype, "cuda"):
                o = packed_response_log_probs(lm, batch, 1.0, with_entropy=True)
                loss = -(o["log_probs"] * mask).sum() / mask.sum()
            loss.backward()
            lm.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        s = min(times[1:])
        out[label] = dict(s=round(s, 3), tflops=round(6 * n * tokens / s / 1e12, 1),
                          peak_gib=round(torch.cuda.max_memory_allocated() / 2**30, 1))
    record("c11_throughput", None, params=n, tokens=tokens, **out,
           note="model_dtype 'auto' computes in bf16 over fp32 master weights on GPUs")


# -- the memory hand-off: an engine's share beside a learner on one GPU ------------------
def one_gpu_settings(model_path: str, **overrides):
    """GRPO's defaults for one learner and one engine on one GPU (local mode, the README's
    one-GPU recipe; `colocate(1)` seats them alike): the `GRPOSettings` table plus the RLlib
    fields such a config holds (the script runs without Ray, so without `GRPOConfig`)."""
    import dataclasses

    from rllib_grpo.rllib.config.settings import GRPOSettings

    @dataclasses.dataclass
    class OneGPURun(GRPOSettings):
        num_learners: int = 0
        num_gpus_per_learner: float = 1
        num_env_runners: int = 0
        num_gpus_per_env_runner: float = 0
        num_epochs: int = 1

    return OneGPURun(model_path=model_path, **overrides)


def plan_prediction(settings, model_path: str, device_bytes: int) -> dict[str, float]:
    """The memory plan's figures for this layout (`rllib_grpo.rllib.config.memory`), bytes
    (the learner's tensors, as ``max_memory_allocated`` counts them: no CUDA context): the
    engine's share, the learner at build and at the peak of its passes and update."""
    from rllib_grpo.models.shapes import model_shape
    from rllib_grpo.rllib.config.memory import (
        BUILD,
        NO_GRAD_PASS,
        UPDATE,
        engine_memory_fraction,
        learner_phases,
    )

    phases = learner_phases(settings, model_shape(model_path), on_gpu=False)
    return {"engine_share": engine_memory_fraction(settings) * device_bytes,
            "learner_build": sum(phases[BUILD].values()),
            "learner_update_peak": max(sum(phases[NO_GRAD_PASS].values()),
                                       sum(phases[UPDATE].values()))}


def _engine_stand_in(nbytes: int, commands, replies) -> None:
    """A vLLM engine's memory in a process of its own: ``wake`` maps its share (weights and
    KV cache), ``sleep`` returns it to the driver (level 2: nothing kept), ``stop``."""
    import torch as t

    dev = "cuda" if t.cuda.is_available() else "cpu"
    share: list = []  # the engine's memory while awake
    while True:
        command = commands.get()
        if command == "stop":
            return
        try:
            if command == "wake":
                share.append(t.empty(nbytes, dtype=t.uint8, device=dev))
            else:
                share.clear()
                if dev == "cuda":
                    t.cuda.empty_cache()
            replies.put(("ok", _free_bytes()))
        except t.OutOfMemoryError as error:
            replies.put(("oom", str(error).splitlines()[0][:300]))
        except Exception as error:  # noqa: BLE001
            replies.put(("error", f"{type(error).__name__}: {error}"[:300]))


def _free_bytes() -> int | None:
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else None


def build_learner(path: str, s, device: torch.device):
    """The learner as `GRPOLearner` builds it for one learner (no FSDP): the policy loaded in
    the master dtype on the host and moved whole to the device (RLlib's `_make_module`),
    the reference in the compute dtype on the device (or host-offloaded), fused AdamW,
    the attention kernel the learner picks."""
    from rllib_grpo.models.attention import prefer_matmul_attention
    from rllib_grpo.models.loading import load_causal_lm
    from rllib_grpo.models.offload import HostOffloaded, offload_optimizer_states
    from rllib_grpo.models.packing import prefer_varlen_attention

    lm = load_causal_lm(path, dtype=s.master_weights_dtype,
                        gradient_checkpointing=s.checkpoints_activations).to(device)
    ref = None
    if s.use_kl_loss or s.use_kl_in_reward:
        ref = load_causal_lm(path, dtype=s.compute_dtype).requires_grad_(False).eval()
        ref = HostOffloaded(ref) if s.ref_param_offload else ref.to(device)
    for model in (lm, ref.model if isinstance(ref, HostOffloaded) else ref):
        if model is not None and not (s.use_remove_padding and prefer_varlen_attention(
                model, device, s.compute_dtype)):
            prefer_matmul_attention(model, device, s.compute_dtype)
    opt = torch.optim.AdamW(lm.parameters(), lr=1e-6, fused=True)
    if s.optimizer_offload:
        offload_optimizer_states(opt)
    return lm, ref, opt


def one_update(lm, ref, opt, s, device: torch.device) -> dict[str, float]:
    """One training step's learner work as `GRPOLearner.update` runs it at ``s``: the
    reference (and, off-policy, the old-log-prob) pass on the update's micro-batches, then
    each micro-batch's forward (autocast to the compute dtype) and backward with verl's loss,
    the clip and the AdamW step; every trajectory at full length (the plan's case)."""
    from contextlib import nullcontext

    from rllib_grpo.algos import agg_loss, kl_penalty, policy_loss
    from rllib_grpo.models.offload import HostOffloaded
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.models.precision import compute_autocast, trained_dtype
    from rllib_grpo.rllib.config.staleness import old_log_probs_from_update
    from rllib_grpo.rllib.learner.micro_batches import (
        MiniBatchTotals,
        select_rows,
        step_micro_batches,
    )

    plan = s.batch_plan()
    rows = plan.trajectories_per_step
    batch = make_batch(rows, s.max_prompt_length, s.max_response_length,
                       lm.config.vocab_size, device, full=True)
    batch["scores"] = torch.randn(rows, device=device)
    batch["advantages"] = torch.randn(rows, 1, device=device).expand_as(
        batch["response_mask"]).contiguous()
    micro_rows = step_micro_batches(batch, s, device)
    forward = packed_response_log_probs if s.use_remove_padding else padded_stats
    with torch.no_grad():
        ref_lp = torch.zeros_like(batch["response_mask"], dtype=torch.float32)
        old_lp = ref_lp.clone()
        old_pass = not old_log_probs_from_update(s)
        offloaded = isinstance(ref, HostOffloaded)
        with ref.on(device) if offloaded else nullcontext():
            ref_model = ref.model if offloaded else ref
            for idx in micro_rows:
                micro = select_rows(batch, idx)
                if ref_model is not None:
                    ref_lp[idx] = forward(ref_model, micro, s.temperature,
                                          token_stats=s.learner_token_stats)["log_probs"]
                if old_pass:
                    with compute_autocast(trained_dtype(lm), s.compute_dtype, device.type):
                        old_lp[idx] = forward(lm, micro, s.temperature,
                                              token_stats=s.learner_token_stats)["log_probs"]
    batch.update(ref_log_probs=ref_lp, old_log_probs=old_lp)
    mask = batch["response_mask"].float()
    totals = MiniBatchTotals(dp_size=1, global_num_tokens=float(mask.sum()),
                             global_num_seqs=float(rows), horizon=s.loss_horizon)
    opt.zero_grad(set_to_none=True)
    for idx in micro_rows:
        micro = select_rows(batch, idx)
        with compute_autocast(trained_dtype(lm), s.compute_dtype, device.type):
            out = forward(lm, micro, s.temperature,
                          with_entropy=s.entropy_coeff != 0 or not old_pass,
                          detach_entropy=s.entropy_coeff == 0, token_stats=s.learner_token_stats)
        m = micro["response_mask"].float()
        log_prob = out["log_probs"]
        old = log_prob.detach() if not old_pass else micro["old_log_probs"]
        loss, _ = policy_loss(s.policy_loss, old_log_prob=old, log_prob=log_prob,
                              advantages=micro["advantages"], response_mask=m,
                              loss_agg_mode=s.loss_agg_mode, clip_ratio=s.clip_ratio,
                              **totals.agg_kwargs())
        if s.use_kl_loss:
            kl = kl_penalty(log_prob, micro["ref_log_probs"], s.kl_loss_type)
            loss = loss + s.kl_loss_coef * agg_loss(kl, m, s.loss_agg_mode, **totals.agg_kwargs())
        loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
    opt.step()
    return {"micro_batches": len(micro_rows), "tokens": float(mask.sum()
                                                              + batch["prompt_mask"].sum()),
            "grad_norm": float(norm)}


def padded_stats(lm, batch, temperature, with_entropy=False, detach_entropy=False,
                 token_stats="full"):
    """`padded_log_probs` in `packed_response_log_probs`'s signature (padded rows)."""
    return {"log_probs": padded_log_probs(lm, batch, temperature)}


def c12_memory_handoff(root):
    """The headline layout on one GPU: a child process holds an awake engine's share of the
    GPU (``gpu_memory_utilization`` x the device) while the parent builds the learner as
    `GRPOLearner` does; the engine sleeps (its share returned) for one update at GRPO's
    defaults; then it wakes, once while the learner keeps its cached memory and once after
    the learner freed it (`rllib_grpo.rllib.choreography.free_device_memory`, gradients
    dropped: `GRPOLearner.release_memory`).  Each peak beside the memory plan's prediction."""
    from rllib_grpo.rllib.choreography import free_device_memory

    if GPU:
        path = q05b_dir(root)
        s = one_gpu_settings(path)
        device_bytes = torch.cuda.mem_get_info()[1]
    else:  # dry run: toy sizes, no memory figures
        path = model_dir(root, "small")
        s = one_gpu_settings(path, prompts_per_step=2, group_size=2, max_prompt_length=8,
                             max_response_length=8)
        device_bytes = 1 << 24
    plan = plan_prediction(s, path, device_bytes)
    gib = 2.0 ** 30
    detail: dict = {"device_gib": round(device_bytes / gib, 1), "compute_dtype": s.compute_dtype,
                    "settings": {k: getattr(s, k) for k in (
                        "prompts_per_step", "group_size", "max_prompt_length",
                        "max_response_length", "max_tokens_per_micro_batch",
                        "use_remove_padding", "ref_param_offload")} | {
                        "micro_batch_size": s.batch_plan().micro_batch_size_per_learner,
                        "use_dynamic_bsz": s.micro_batches_by_tokens,
                        "gradient_checkpointing": s.checkpoints_activations,
                        "token_stats": s.learner_token_stats},
                    "plan_gib": {k: round(v / gib, 2) for k, v in plan.items()}}
    ctx = mp.get_context("spawn")
    commands, replies = ctx.Queue(), ctx.Queue()
    engine = ctx.Process(target=_engine_stand_in, daemon=True,
                         args=(int(plan["engine_share"]), commands, replies))
    engine.start()

    def engine_does(command: str) -> str:
        commands.put(command)
        kind, info = replies.get(timeout=120)
        return "ok" if kind == "ok" else f"{kind}: {info}"

    def measured() -> dict:
        if not GPU:
            return {}
        free, total = torch.cuda.mem_get_info()
        return {"peak_allocated_gib": round(torch.cuda.max_memory_allocated() / gib, 2),
                "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / gib, 2),
                "device_used_gib": round((total - free) / gib, 2)}

    try:
        detail["engine_awake"] = engine_does("wake")
        if GPU:
            torch.cuda.reset_peak_memory_stats()
        lm = ref = opt = None
        try:
            lm, ref, opt = build_learner(path, s, DEV)
            detail["build"] = {"result": "ok", **measured()}
        except torch.OutOfMemoryError as error:
            detail["build"] = {"result": "oom: " + str(error).splitlines()[0][:200], **measured()}
        detail["engine_asleep"] = engine_does("sleep")
        if lm is not None:
            if GPU:
                torch.cuda.reset_peak_memory_stats()
            try:
                detail["update"] = {"result": "ok", **one_update(lm, ref, opt, s, DEV),
                                    **measured()}
            except torch.OutOfMemoryError as error:
                detail["update"] = {"result": "oom: " + str(error).splitlines()[0][:200],
                                    **measured()}
        # Wake while the learner keeps its cache, as the package did before the choreography.
        detail["wake_learner_cache_kept"] = {"engine": engine_does("wake"), **measured()}
        if detail["wake_learner_cache_kept"]["engine"] == "ok":
            engine_does("sleep")
        if opt is not None:
            opt.zero_grad(set_to_none=True)
        free_device_memory()
        detail["wake_after_learner_freed"] = {"engine": engine_does("wake"), **measured()}
    finally:
        commands.put("stop")
        engine.join(timeout=30)
        if engine.is_alive():
            engine.kill()
    ok = detail["engine_awake"] == "ok" and detail["wake_after_learner_freed"]["engine"] == "ok"
    record("c12_memory_handoff", ok, **detail,
           finding="N3: a learner that keeps its cached memory makes the engine's wake-up "
                   "fail; N2/N5: build and update peaks against the plan")


# -- one colocate(1) step through vLLM's ipc engine (Ray and vLLM) ----------------------
def c13_vllm_colocate(root):
    """One GRPO step of `colocate(1)`: a learner and a vLLM engine in two Ray actors on one
    GPU, the engine asleep (level 2) through the update, the weights through vLLM's ``ipc``
    engine; in a fresh interpreter (this one has Ray and vLLM blocked)."""
    missing = [name for name in ("ray", "vllm") if not PRESENT[name]]
    if missing:
        return record("c13_vllm_colocate", None,
                      skipped=f"{' and '.join(missing)} not installed: needs Ray and vLLM")
    if not GPU:
        return record("c13_vllm_colocate", None, skipped="no GPU")
    import subprocess

    done = subprocess.run([sys.executable, os.path.abspath(__file__), COLOCATE_CHILD, root],
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if not lines:
        return record("c13_vllm_colocate", False, rc=done.returncode,
                      stderr=done.stderr[-2500:])
    result = json.loads(lines[-1][len("RESULT "):])
    record("c13_vllm_colocate", result.get("transport") == "ipc"
           and result.get("rollout_log_probs_diff_max", 1.0) < 0.1, **result)


COLOCATE_CHILD = "--colocate-child"


def colocate_child(root: str) -> None:
    """`c13_vllm_colocate`'s interpreter: one training step, then ``RESULT <json>``."""
    import ray

    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.weights.plan import TRANSPORT_CODES

    ray.init(num_cpus=4, num_gpus=1, include_dashboard=False, log_to_driver=False)
    config = (GRPOConfig().environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 9})
              .training(model_path=model_dir(root, "small"), sampler="vllm",
                        weight_sync_transport="ipc", prompts_per_step=8, group_size=4,
                        max_prompt_length=32, max_response_length=32)
              .debugging(seed=0).colocate(1))
    algo = config.build_algo()
    try:
        t = time.perf_counter()
        result = algo.train()
        step_s = time.perf_counter() - t
        codes = {code: name for name, code in TRANSPORT_CODES.items()}
        print("RESULT " + json.dumps({
            "transport": codes.get(result.get("weight_sync/transport")),
            "rollout_log_probs_diff_max": result.get("training/rollout_log_probs_diff_max"),
            "step_s": round(step_s, 2),
            "update_weights_s": result.get("timing_s/update_weights")}, default=str), flush=True)
    finally:
        algo.stop()
        ray.shutdown()


CHECKS = [("c0", c0_env), ("c1", c1_perf), ("c2", c2_packing), ("c3", c3_sampler),
          ("c6", c6_shm), ("c9", c9_fsdp), ("c10", c10_offload), ("c11", c11_throughput),
          ("c12", c12_memory_handoff), ("c13", c13_vllm_colocate)]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated check ids (c0..c13)")
    ap.add_argument("--no-big", action="store_true",
                    help="skip c10/c11/c12 (they build a 0.5B model)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    root = tempfile.mkdtemp(prefix="gpu_review_")
    for key, fn in CHECKS:
        if (only and key not in only) or (args.no_big and key in ("c10", "c11", "c12")):
            continue
        guarded(fn.__name__, fn, root)
    bad = [r["check"] for r in RESULTS if r["ok"] is False]
    record("summary", not bad, failed=bad, total_s=round(time.perf_counter() - T0, 1))
    import shutil

    shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == [COLOCATE_CHILD]:
        colocate_child(sys.argv[2])
    else:
        sys.exit(main())
