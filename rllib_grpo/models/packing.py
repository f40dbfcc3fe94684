"""Padding-free ("packed") forward passes of a causal LM over prompt + response rows.

A micro-batch arrives padded: prompts ``(B, P)`` left-padded, responses ``(B, R)``
right-padded.  Packing concatenates each sequence's real tokens (prompt then
response) into a few rows, position ids restarting at 0 for every sequence, and no
attention mask.  transformers (>= 4.55; this project needs 5.16) recognises that
layout from the position ids alone (``masking_utils.find_packed_sequence_indices``)
and confines attention to each sequence:

* ``flash_attention_2`` / ``flash_attention_3`` (GPU): the varlen kernels, built
  from the position ids, with no mask at all.  One row holds the whole micro-batch
  (at most the token budget: verl's ``use_remove_padding=True`` layout);
* ``sdpa``, ``eager``, ``flex_attention`` (any device, CPU included): a
  block-diagonal causal mask built from the position ids.  That mask is dense, so a
  row of T tokens costs T^2 attention: sequences are packed first-fit-decreasing into
  rows no longer than the micro-batch's longest sequence, which removes the padding
  and never makes a row's attention cost more than a padded row's.

The response log-probs (and entropies) come back as ``(B, R)`` tensors with zeros
on padding, exactly like `rllib_grpo.rllib.learner.module.response_log_probs` (to float
precision: ``tests/rllib/learner/test_packing.py``), so every loss and aggregation downstream is
unchanged.  No Ray here.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any

import numpy as np
import torch

from rllib_grpo.algos import entropy_from_logits, logprobs_from_logits
from rllib_grpo.algos.token_stats import chunked_token_stats
from rllib_grpo.models.lm_head import fused_head, token_stats_mode

# Attention implementations whose kernels take packed rows without a dense mask.
VARLEN_ATTENTION = ("flash_attention_2", "flash_attention_3")


def attention_implementation(lm: torch.nn.Module) -> str:
    """The attention implementation ``lm`` (HF, peft- or FSDP-wrapped) runs with."""
    config = getattr(lm, "config", None)
    return str(getattr(config, "_attn_implementation", None) or "eager")


def uses_varlen_attention(lm: torch.nn.Module) -> bool:
    """Whether ``lm`` attends with a varlen kernel (one packed row costs no dense mask)."""
    return any(name in attention_implementation(lm) for name in VARLEN_ATTENTION)


def pack_rows(seq_lengths: list[int], row_capacity: int) -> list[list[int]]:
    """Sequences into rows of at most ``row_capacity`` tokens, first-fit decreasing.

    Returns the sequence indices of each row (deterministic: ties by index).
    Raises ``ValueError`` when a sequence is longer than a row.
    """
    if seq_lengths and max(seq_lengths) > row_capacity:
        raise ValueError(f"a sequence of {max(seq_lengths)} tokens does not fit a packed row "
                         f"of {row_capacity} tokens")
    rows: list[list[int]] = []
    free: list[int] = []
    for index in sorted(range(len(seq_lengths)), key=lambda i: (-seq_lengths[i], i)):
        for row, room in enumerate(free):
            if seq_lengths[index] <= room:
                rows[row].append(index)
                free[row] -= seq_lengths[index]
                break
        else:
            rows.append([index])
            free.append(row_capacity - seq_lengths[index])
    return rows


@dataclasses.dataclass
class PackedMicroBatch:
    """One micro-batch in packed layout, and the indices that unpack its outputs.

    Attributes:
        input_ids: ``(rows, row_len)`` tokens; row tails are padding (token 0).
        position_ids: ``(rows, row_len)`` restarting at 0 for every sequence (tails 0).
        predictor_rows, predictor_cols: for each response token of the padded batch
            (``response_mask`` order, row-major), where the logit that predicts it
            sits in the packed rows (the token just before it).
        target_ids: those response tokens.
        response_mask: ``(B, R)`` bool, where the unpacked values go.
        num_real_tokens: prompt + response tokens packed (no padding).
        attention_mask: ``(rows, 1, row_len, row_len)`` bool (True: attend) where the
            layout needs one beyond what the position ids say (shared prompts:
            `rllib_grpo.models.shared_prefix`); None: built from the position ids.
        source_index, packed_index: for each real token, its flat index in the padded
            ``(B, P + R)`` rows and its slot in the flat packed rows (`pack_micro_batch`'s
            layout; None where a layout has no such one-to-one map).
        model_inputs: more inputs of the model's forward (a vision-language model's
            images: `rllib_grpo.models.vision_forward`).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predictor_rows: torch.Tensor
    predictor_cols: torch.Tensor
    target_ids: torch.Tensor
    response_mask: torch.Tensor
    num_real_tokens: int
    attention_mask: torch.Tensor | None = None
    source_index: np.ndarray | None = None
    packed_index: np.ndarray | None = None
    model_inputs: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


def forward_kwargs(packed: PackedMicroBatch) -> dict[str, torch.Tensor]:
    """The forward's ``attention_mask`` argument where the layout carries its own mask, and
    the layout's other model inputs."""
    mask = {} if packed.attention_mask is None else {"attention_mask": packed.attention_mask}
    return {**mask, **packed.model_inputs}


def pack_micro_batch(batch: dict[str, torch.Tensor], varlen: bool) -> PackedMicroBatch:
    """Pack the real tokens of a padded micro-batch (see the module docstring).

    Args:
        batch: ``prompt_ids``/``prompt_mask`` (B, P), left-padded, and
            ``response_ids``/``response_mask`` (B, R), right-padded.
        varlen: one row for the whole micro-batch (varlen attention kernels), else
            rows no longer than the longest sequence.
    """
    # The layout is index bookkeeping on the host (numpy: small ops cost microseconds);
    # the device does one gather/scatter of the tokens.
    prompt_mask = batch["prompt_mask"].detach().cpu().numpy().astype(bool)
    response_mask = batch["response_mask"].detach().cpu().numpy().astype(bool)
    width = prompt_mask.shape[1] + response_mask.shape[1]
    full_mask = np.concatenate([prompt_mask, response_mask], axis=1)
    lengths = full_mask.sum(axis=1)
    if (~prompt_mask.any(axis=1) & response_mask.any(axis=1)).any():
        raise ValueError("a response without a prompt token has no logit to predict its "
                         "first token; every row needs at least one prompt token")
    total = int(lengths.sum())
    capacity = max(total, 1) if varlen else max(int(lengths.max(initial=1)), 1)
    length_list = lengths.tolist()
    rows = pack_rows(length_list, capacity)
    row_len = max([sum(length_list[i] for i in row) for row in rows] + [1])
    starts = [0] * len(length_list)  # where each sequence starts in the flat packed rows
    for r, row in enumerate(rows):
        offset = r * row_len
        for index in row:
            starts[index] = offset
            offset += length_list[index]
    seq_start = np.asarray(starts, dtype=np.int64)
    # Real tokens in row-major order (each sequence's tokens contiguous, prompt first).
    source = np.flatnonzero(full_mask)
    seq_of = source // width
    first = np.cumsum(lengths) - lengths
    position_in_seq = np.arange(total) - first[seq_of]
    destination = seq_start[seq_of] + position_in_seq
    # Response tokens, in response_mask order; the logit predicting each sits one slot
    # earlier in its packed row (the same sequence: every response has a prompt token).
    targets = np.flatnonzero(source % width >= prompt_mask.shape[1])
    predictor = destination[targets - 1]

    device = batch["prompt_ids"].device
    num_rows = max(len(rows), 1)
    flat_ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1).long().reshape(-1)
    source_t = torch.from_numpy(source).to(device)
    input_ids = torch.zeros(num_rows * row_len, dtype=torch.long, device=device)
    input_ids[torch.from_numpy(destination).to(device)] = flat_ids[source_t]
    position_ids = np.zeros(num_rows * row_len, dtype=np.int64)
    position_ids[destination] = position_in_seq
    return PackedMicroBatch(
        input_ids=input_ids.view(num_rows, row_len),
        position_ids=torch.from_numpy(position_ids).view(num_rows, row_len).to(device),
        predictor_rows=torch.from_numpy(predictor // row_len).to(device),
        predictor_cols=torch.from_numpy(predictor % row_len).to(device),
        target_ids=flat_ids[source_t[torch.from_numpy(targets).to(device)]],
        response_mask=batch["response_mask"].bool(),
        num_real_tokens=total,
        source_index=source,
        packed_index=destination,
    )


def packed_response_log_probs(
    lm: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    with_entropy: bool = False,
    detach_entropy: bool = False,
    layout: PackedMicroBatch | None = None,
    token_stats: str = "full",
) -> dict[str, torch.Tensor]:
    """`rllib_grpo.rllib.learner.module.response_log_probs` computed on packed rows.

    Same arguments and result: ``{"log_probs": (B, R), "entropy": (B, R) if
    with_entropy}`` (float32), zeros on padding positions; ``detach_entropy``: the
    entropy is for metrics only (no graph); ``token_stats``: how the log-probs and
    entropies are computed from the last hidden states (`rllib_grpo.models.lm_head`).  The
    graph always reaches the model's parameters, even when no row has a response token (a
    sharded model then still runs its collective backward).  ``layout``: ``batch`` already
    packed another way (shared prompts: `rllib_grpo.models.shared_prefix`); None:
    `pack_micro_batch`.
    """
    packed = layout if layout is not None else pack_micro_batch(
        batch, varlen=uses_varlen_attention(lm))
    cols = packed.predictor_cols
    rows = packed.predictor_rows
    if cols.numel() == 0:  # nothing to score: keep one logit so backward reaches the model
        cols, rows = cols.new_zeros(1), rows.new_zeros(1)
    mode = token_stats_mode(lm, token_stats)
    n = packed.target_ids.numel()
    if mode == "full":
        # Only the logits that predict response tokens go through the LM head.
        keep, keep_index = torch.unique(cols, return_inverse=True)
        logits = lm(
            input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
            logits_to_keep=keep, **forward_kwargs(packed),
        ).logits
        response_logits = logits[rows, keep_index].float() / temperature
        values = {"log_probs": logprobs_from_logits(response_logits, packed.target_ids)
                  if n else response_logits[:0, 0]}
        if with_entropy:
            with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_entropy):
                values["entropy"] = entropy_from_logits(response_logits[:n])
        anchor = response_logits
    else:
        values, anchor = _chunked_values(lm, packed, rows, cols, temperature,
                                         with_entropy, detach_entropy, fused=mode == "fused")
    out: dict[str, torch.Tensor] = {}
    shape = packed.response_mask.shape
    for name, value in values.items():
        unpacked = torch.zeros(shape, dtype=torch.float32, device=value.device)
        unpacked = unpacked.masked_scatter(packed.response_mask, value.float())
        if n == 0 and value.requires_grad:
            unpacked = unpacked + 0.0 * anchor.sum()
        out[name] = unpacked
    return out


def _chunked_values(lm: torch.nn.Module, packed: PackedMicroBatch, rows: torch.Tensor,
                    cols: torch.Tensor, temperature: float, with_entropy: bool,
                    detach_entropy: bool, fused: bool
                    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """``token_stats`` ``"chunked"`` / ``"fused"`` (`rllib_grpo.models.lm_head`): the values
    of `packed_response_log_probs`, and the tensor that anchors an empty batch's graph."""
    n = packed.target_ids.numel()
    weight = None
    if fused:
        decoder, weight = fused_head(lm)  # type: ignore[misc]
        hidden = decoder(input_ids=packed.input_ids, position_ids=packed.position_ids,
                         use_cache=False, **forward_kwargs(packed)).last_hidden_state
        inputs = hidden[rows, cols]
        device = inputs.device.type
        if torch.is_autocast_enabled(device):  # the head in the compute dtype, as autocast
            compute = torch.get_autocast_dtype(device)
            inputs, weight = inputs.to(compute), weight.to(compute)
        elif weight.dtype != inputs.dtype:
            weight = weight.to(inputs.dtype)
    else:
        keep, keep_index = torch.unique(cols, return_inverse=True)
        logits = lm(input_ids=packed.input_ids, position_ids=packed.position_ids,
                    use_cache=False, logits_to_keep=keep, **forward_kwargs(packed)).logits
        inputs = logits[rows, keep_index]
    log_probs, entropy = chunked_token_stats(inputs[:n], packed.target_ids, temperature,
                                             weight=weight, with_entropy=with_entropy,
                                             stats_dtype=torch.float32)  # as .float() below
    values = {"log_probs": log_probs}
    if entropy is not None:
        values["entropy"] = entropy.detach() if detach_entropy else entropy
    return values, inputs


# The varlen kernels in order of preference: (attention implementation, module, compute
# capability majors it is built for (None: any)).  FA3 (``flash_attn_interface``, the
# flash-attn-3 wheel) targets Hopper (sm90) only; FA2 (``flash_attn``) Ampere and later.
FLASH_KERNELS: tuple[tuple[str, str, tuple[int, ...] | None], ...] = (
    ("flash_attention_3", "flash_attn_interface", (9,)),
    ("flash_attention_2", "flash_attn", None),
)


@functools.cache
def flash_attention_runs(device: torch.device, module: str = "flash_attn") -> bool:
    """Whether ``module`` (``flash_attn``: FA2; ``flash_attn_interface``: FA3) imports and
    its varlen kernel runs a tiny causal call on ``device`` (probed once per device and
    module, then cached).

    ``find_spec`` is not enough: a wheel built for another torch or CUDA is found, then
    fails at import (undefined symbol) or at its first kernel launch, which would be the
    first training forward.  Any failure here means: do not use that kernel.
    """
    try:
        flash_attn_varlen_func = importlib.import_module(module).flash_attn_varlen_func
        q = torch.ones(3, 1, 64, device=device, dtype=torch.bfloat16)  # (tokens, heads, dim)
        seq_starts = torch.tensor([0, 1, 3], device=device, dtype=torch.int32)  # 2 sequences
        out = flash_attn_varlen_func(q, q, q, seq_starts, seq_starts, 2, 2, causal=True)
        out = out[0] if isinstance(out, tuple) else out  # some FA3 releases return (out, lse)
        return bool(torch.isfinite(out).all().item())
    except Exception:  # noqa: BLE001  (ImportError, OSError, RuntimeError, CUDA errors)
        return False


def varlen_kernels(device: torch.device) -> list[str]:
    """The attention implementations whose kernel runs on ``device``, best first: FA3 on
    Hopper (compute capability 9.x) where ``flash_attn_interface`` runs, FA2 where
    ``flash_attn`` runs; none off CUDA."""
    if device.type != "cuda":
        return []
    major = torch.cuda.get_device_capability(device)[0]
    return [name for name, module, majors in FLASH_KERNELS
            if (majors is None or major in majors) and flash_attention_runs(device, module)]


def prefer_varlen_attention(lm: torch.nn.Module, device: torch.device, compute_dtype: str) -> bool:
    """Switch ``lm`` to the best varlen kernel that runs (`varlen_kernels`: FA3 on Hopper,
    else FA2) where packed rows can use it.

    Only on CUDA with a 16-bit compute dtype (the kernels take no float32); a kernel
    transformers refuses to switch to (e.g. an FA3 build it does not recognise) gives way to
    the next.  Returns whether ``lm`` now attends with a varlen kernel; elsewhere it keeps
    its implementation (``sdpa``: a block-diagonal mask).
    """
    if uses_varlen_attention(lm):
        return True
    if device.type != "cuda" or compute_dtype not in ("bfloat16", "float16"):
        return False
    base: Any = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # type: ignore[operator]
    for name in varlen_kernels(device):
        try:
            base.set_attn_implementation(name)
        except (ImportError, ValueError):  # transformers' own availability check said no
            continue
        return uses_varlen_attention(lm)
    return False
