"""A sampler on transformers' ``generate``: the fallback where vLLM does not import."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rllib_grpo.models.loading import load_causal_lm
from rllib_grpo.models.tokenizers import load_tokenizer
from rllib_grpo.samplers.base import (
    CallSeeds,
    Sample,
    SamplingParams,
    combined_seed,
    runner_device,
    state_dict_bytes,
)
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import GroupSpec, SlotsSpec
from rllib_grpo.weights.wire import (
    HOST_BACKENDS,
    SPARSE_BACKENDS,
    BucketUpdate,
    DispatchInit,
    GroupInit,
    HostReceiver,
    apply_patch,
    manifest_from_wire,
    manifest_to_wire,
)

logger = logging.getLogger(__name__)


class HFSampler:
    """Samples with its own copy of a transformers causal LM.

    All prompts x ``n`` samples go through one left-padded ``generate`` call
    (or chunks of ``max_batch_size`` rows).  Log-probs come from the processed
    scores (temperature, top-k, top-p applied), i.e. the sampling distribution,
    gathered at the drawn token step by step (`ChosenTokenLogProbs`).  ``device=None``
    is the GPU this process holds, else the CPU (`rllib_grpo.samplers.base.runner_device`).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: str = "float32",
        seed: int = 0,
        device: str | torch.device | None = None,
        max_batch_size: int | None = None,
        config_overrides: dict | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else runner_device()
        self.model = load_causal_lm(model_path, dtype=dtype,
                                    config_overrides=config_overrides).to(self.device)
        self.eos_token_ids = _eos_token_ids(self.model, tokenizer_path or model_path)
        if not self.eos_token_ids:
            logger.warning("no eos token found for %s: samples end only at max_tokens", model_path)
        pad_id = self.model.generation_config.pad_token_id
        self.pad_token_id = pad_id if pad_id is not None else min(self.eos_token_ids, default=0)
        # generate() fills every unset option from model.generation_config (a hub
        # model's repetition_penalty, top_k, ...): keep only the token ids there.
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_token_ids), pad_token_id=self.pad_token_id
        )
        self.seeds = CallSeeds(seed)
        self.max_batch_size = max_batch_size
        self._weight_receiver = HostReceiver()
        self._transfer_backend: str | None = None
        self._live: dict[str, torch.Tensor] | None = None  # parameters and buffers by name
        self._checked_names: tuple | None = None
        self._homes: list[torch.Tensor | None] = []  # per bucket: the parameters' memory
        self._homed: str | None = None  # the layout they follow

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams,
        *, seeds: Sequence[int] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; reproducible for a given ``params.seed``.

        ``seeds`` (one per prompt): one batched ``generate`` has one RNG, so the call
        is seeded from all of them (`rllib_grpo.samplers.base.combined_seed`).
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = [list(prompt) for prompt in prompts for _ in range(n)]
        stop_ids = self.eos_token_ids | set(params.stop_token_ids or ())
        chunk = self.max_batch_size or max(len(rows), 1)
        samples: list[Sample] = []
        call_seed = combined_seed(seeds) if seeds is not None else self.seeds.next(params)
        with _seeded_rng(call_seed, self.device):
            for start in range(0, len(rows), chunk):
                samples += self._generate_rows(rows[start : start + chunk], params, stop_ids)
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def load_weights(
        self, state_dict: Mapping[str, torch.Tensor], *, partial: bool = False
    ) -> dict[str, float]:
        """Copy a full HF-named state dict into the model; a tied ``lm_head.weight`` may be left out.

        ``partial=True`` (the LoRA sync's merged layers) copies a subset and keeps the rest.
        """
        start = time.perf_counter()
        self._check_names(set(state_dict), partial)
        self._copy_into_model(state_dict.items())
        return {"bytes": state_dict_bytes(state_dict), "seconds": time.perf_counter() - start}

    # ------------------------------------------------------------------ weight transfer
    # The receiving side of `rllib_grpo.weights.transport`: weights stream in by bucket and
    # are copied into the live parameters (in place, cast to the model's dtype).
    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype weights should travel in: the model's."""
        return next(self.model.parameters()).dtype

    @property
    def num_weight_ranks(self) -> int:
        """One rank in a weight group: the sampler's own process."""
        return 1

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """vLLM's API on the transformers sampler: join the group of one of our host-memory
        engines (``grpo_shm``, ``grpo_gloo``, ``grpo_sparse_gloo``; vLLM's own are GPU
        engines for vLLM models)."""
        info = DispatchInit(**init_info)
        if info.backend not in HOST_BACKENDS:
            raise ValueError(f"the transformers sampler takes weights through "
                             f"{', '.join(HOST_BACKENDS)}, not {info.backend!r}")
        self._weight_receiver.init(GroupInit(**info.init_info))
        self._transfer_backend = info.backend

    def start_weight_update(self) -> None:
        """Nothing to prepare: weights are copied into the live parameters."""

    def update_weights(self, update_info: dict) -> None:
        """Receive one update into the model: dense buckets (into the parameters themselves
        where `prepare_weights` laid them out so) or sparse patches, in place."""
        if self._transfer_backend in SPARSE_BACKENDS:
            self._apply_patches(self._weight_receiver.patches(update_info))
            return
        manifest = manifest_from_wire(update_info["manifest"])
        homes = self._homes if manifest.fingerprint == self._homed else None
        self._copy_into_model(self._weight_receiver.stream(update_info, homes=homes))

    def finish_weight_update(self) -> None:
        """Nothing to finish: the copies are done when `update_weights` returns."""

    def shutdown_weight_transfer_engine(self) -> None:
        self._weight_receiver.close()
        self._transfer_backend = None

    @torch.no_grad()
    def _apply_patches(self, patches: Iterable[Any]) -> None:
        live = self._live_tensors()
        for patch in patches:
            apply_patch(live[patch.name], patch)

    def join_weight_group(self, spec: GroupSpec, rank: int) -> None:
        """Join a weight group as ``rank`` (``grpo_gloo``/``grpo_shm``)."""
        self._weight_receiver.init(GroupInit.of(spec, rank_offset=rank))
        self._transfer_backend = "grpo_gloo"

    def prepare_weights(self, manifest: Manifest, slots: SlotsSpec | None = None,
                        check: bool = True, in_place: bool = True) -> None:
        """Refuse a partial or foreign manifest (before any byte moves); keep the slots;
        with ``in_place``, lay the parameters out like the manifest's buckets (once per
        layout), so that a broadcast bucket lands in the parameters themselves."""
        if check:
            self._check_names(manifest.names(), manifest.partial)
        self._slots = slots
        if in_place and not manifest.partial and manifest.fingerprint != self._homed:
            self._home(manifest)

    def receive_weights(self, manifest: Manifest, via: str, ipc: dict | None = None,
                        materialize: bool = False) -> dict:
        """Stream a sync from the joined group into the model; ``materialize`` returns the
        tensors (copies) instead, for a payload the caller rebuilds (LoRA)."""
        if ipc is not None or via not in ("shm", "collective"):
            raise ValueError(f"receive_weights takes 'shm' or 'collective' syncs, not {via!r}")
        start = time.perf_counter()
        slots = getattr(self, "_slots", None) if via == "shm" else None
        info = BucketUpdate(manifest_to_wire(manifest), list(slots.paths) if slots else None,
                            slots.nbytes if slots else 0)
        homes = self._homes if manifest.fingerprint == self._homed else None
        stream = self._weight_receiver.stream(info, homes=homes)
        if materialize:
            tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in stream}
            return {"tensors": tensors, "seconds": time.perf_counter() - start}
        self._copy_into_model(stream)
        return {"bytes": manifest.nbytes, "seconds": time.perf_counter() - start}

    def leave_weight_group(self) -> None:
        """Leave the weight group (a no-op outside one)."""
        self.shutdown_weight_transfer_engine()

    def _check_names(self, names: set[str], partial: bool) -> None:
        key = (frozenset(names), partial)
        if key != self._checked_names:  # the same names every sync: check them once
            _check_state_dict_keys(self.model, names, partial=partial)
            self._checked_names = key

    @torch.no_grad()
    def _copy_into_model(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy in place; a tied weight given under both names is copied once, a tensor
        received into the parameter itself (see `_home`) not at all."""
        live = self._live_tensors()
        done: set[int] = set()
        for name, tensor in weights:
            target = live[name]
            if id(target) in done:
                continue
            tensor = torch.as_tensor(tensor)
            if target.shape != tensor.shape:  # copy_ would broadcast silently
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not fit the "
                                 f"sampler's {tuple(target.shape)}")
            if not (tensor.data_ptr() == target.data_ptr() and tensor.dtype == target.dtype
                    and tensor.stride() == target.stride()):
                target.copy_(tensor)
            done.add(id(target))

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        if self._live is None:
            self._live = self.model.state_dict(keep_vars=True)
        return self._live

    @torch.no_grad()
    def _home(self, manifest: Manifest) -> None:
        """Move each bucket's parameters (those of its dtype and shape) into one flat
        tensor laid out like the bucket: the parameters become views of it."""
        live = self._live_tensors()
        homes: list[torch.Tensor | None] = []
        for bucket in manifest.buckets:
            found = [live.get(e.name) for e in bucket.entries]
            targets = [t for t in found if t is not None]
            if len(targets) < len(found) or any(
                    t.dtype != bucket.dtype or tuple(t.shape) != e.shape
                    for t, e in zip(targets, bucket.entries, strict=True)):
                homes.append(None)
                continue
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=self.device)
            for entry, target in zip(bucket.entries, targets, strict=True):
                view = flat.narrow(0, entry.offset, entry.numel).view(entry.shape)
                view.copy_(target)
                target.data = view
            homes.append(flat)
        self._homes, self._homed = homes, manifest.fingerprint

    def sleep(self) -> None:
        """No-op: the transformers sampler keeps its weights where they are."""

    def wake_up(self) -> None:
        """No-op (see ``sleep``)."""

    def close(self) -> None:
        """Drop the model."""
        self._weight_receiver.close()
        self.model, self._live = None, None

    # ------------------------------------------------------------------ internals

    def _generation_config(self, params: SamplingParams, stop_ids: set[int]) -> GenerationConfig:
        """Sampling or greedy, with no warper of transformers' own: `_warpers` applies
        temperature, top-k and top-p before the log-probs are taken."""
        sampling = params.temperature > 0
        # Greedy: no sampling option at all (transformers warns about any that is set).
        return GenerationConfig(
            do_sample=sampling,
            temperature=1.0 if sampling else None,
            top_p=1.0 if sampling else None,
            top_k=0 if sampling else None,  # 0: off (transformers' default is 50)
            max_new_tokens=params.max_tokens,
            eos_token_id=sorted(stop_ids),
            pad_token_id=self.pad_token_id,
        )

    @torch.no_grad()
    def _generate_rows(
        self, rows: list[list[int]], params: SamplingParams, stop_ids: set[int]
    ) -> list[Sample]:
        input_ids, attention_mask = _left_padded(rows, self.pad_token_id, self.device)
        log_probs = ChosenTokenLogProbs()
        sequences = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask,
            generation_config=self._generation_config(params, stop_ids),
            logits_processor=LogitsProcessorList([*_warpers(params), log_probs]),
        )
        new_token_ids = sequences[:, input_ids.shape[1] :]
        new_token_log_probs = log_probs.finish(sequences[:, -1])[:, : new_token_ids.shape[1]]
        return [
            _trimmed_sample(ids, lps, stop_ids)
            for ids, lps in zip(new_token_ids.tolist(), new_token_log_probs.tolist(), strict=True)
        ]


class ChosenTokenLogProbs(LogitsProcessor):
    """The last logits processor of a ``generate`` call: the processed log-prob of each
    drawn token, without keeping any step's full-vocabulary scores.

    A step's scores are held until the next step shows the token drawn from them (the last
    column of ``input_ids``), then reduced to that token's ``log_softmax``: one
    rows x vocab tensor at a time instead of ``output_scores``' rows x steps x vocab.
    """

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None  # the last step's processed scores
        self.per_step: list[torch.Tensor] = []  # [rows] log-probs, one per finished step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor
                 ) -> torch.FloatTensor:
        if self.pending is not None:
            self._gather(input_ids[:, -1])
        self.pending = scores
        return scores

    def finish(self, last_token_ids: torch.Tensor) -> torch.Tensor:
        """[rows, steps] log-probs, the last step's taken at ``last_token_ids``.  (A
        decoding step transformers undoes at the end adds one trailing column.)"""
        if self.pending is not None:
            self._gather(last_token_ids)
        if not self.per_step:
            return torch.zeros(len(last_token_ids), 0)
        return torch.stack(self.per_step, dim=1)

    def _gather(self, token_ids: torch.Tensor) -> None:
        assert self.pending is not None
        log_probs = self.pending.float().log_softmax(-1)
        self.per_step.append(log_probs.gather(-1, token_ids[:, None])[:, 0])
        self.pending = None


def _warpers(params: SamplingParams) -> list[LogitsProcessor]:
    """Temperature, top-k and top-p: transformers' own warpers in its own order, so that
    `ChosenTokenLogProbs` after them sees the sampling distribution."""
    if params.temperature <= 0:
        return []
    warpers: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    return warpers


def _eos_token_ids(model: Any, tokenizer_path: str) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer, as vLLM unites them."""
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id, model.config.eos_token_id):
        ids |= {source} if isinstance(source, int) else set(source or ())
    with contextlib.suppress(OSError, ValueError):  # a weights-only folder has no tokenizer
        eos_id = load_tokenizer(tokenizer_path).eos_token_id
        if eos_id is not None:
            ids.add(eos_id)
    return ids


def _left_padded(
    rows: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _trimmed_sample(ids: list[int], log_probs: list[float], stop_ids: set[int]) -> Sample:
    """Cut after the first stop token (kept); what follows is padding."""
    for i, token_id in enumerate(ids):
        if token_id in stop_ids:
            return Sample(ids[: i + 1], log_probs[: i + 1], "stop")
    return Sample(ids, log_probs, "length")


@contextlib.contextmanager
def _seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for one call and restore the caller's RNG state afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def _check_state_dict_keys(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor] | set[str],
    partial: bool = False,
) -> None:
    expected = set(model.state_dict())
    missing = set() if partial else expected - set(state_dict) - _tied_aliases(model, set(state_dict))
    unexpected = set(state_dict) - expected
    if missing or unexpected:
        raise KeyError(
            f"state dict does not match the sampler's model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def _tied_aliases(model: torch.nn.Module, provided: set[str]) -> set[str]:
    """State-dict keys that share storage with a provided key (a tied ``lm_head.weight``)."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict().items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    return {name for names in by_storage.values() if names & provided for name in names - provided}
