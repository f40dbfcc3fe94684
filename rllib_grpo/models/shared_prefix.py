"""Packed rows in which a group's responses share one copy of their prompt.

GRPO samples ``group_size`` responses per prompt; with one row per response every learner
pass (old log-probs, reference, update) runs the prompt once per response.  Where prompts
are long next to responses (a chat template's system prompt before a one-line question,
and answers of a dozen tokens) most of the learner's tokens would be copies of prompts.

Here the sequences of a micro-batch whose real prompt tokens are identical become one
*unit*: ``[prompt, response_1, ..., response_k]``.  Position ids run ``0..P-1`` over the
prompt and restart at ``P`` for every response; a 4-D attention mask lets each response
token attend to the prompt and to its own earlier tokens only, so every response sees
exactly what it saw in its own row.  The prompt's hidden states are computed once and the
gradients of all k responses meet in them, which is what k separate copies would sum to:
the log-probs, the loss and the gradients are the unshared ones (checked in float64:
``tests/models/test_shared_prefix.py``).

Only with a dense-mask attention (``sdpa``, the CPU default, or
`rllib_grpo.models.attention.MATMUL_ATTENTION`, CPU at 16 bits): the varlen kernels of
flash-attention take no custom mask.  A row's dense attention costs ``L^2`` against the
linear layers' ``L * hidden_size``-proportional cost, so units are capped at
``max(longest sequence, hidden_size)`` tokens (a group too large for one unit is split
into several, each with its own copy of the prompt) and rows at the longest unit.  No Ray
here.
"""

from __future__ import annotations

import numpy as np
import torch

from rllib_grpo.models.attention import MATMUL_ATTENTION
from rllib_grpo.models.packing import PackedMicroBatch, attention_implementation, pack_rows

# The attention implementations that take a custom boolean 4-D mask (True: attend).
SHARED_PREFIX_ATTENTION = ("sdpa", MATMUL_ATTENTION)


def prompt_groups(prompts: list[tuple[int, ...]]) -> list[list[int]]:
    """Indices of the sequences whose real prompt tokens are identical, in order of first
    appearance (members in index order)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, prompt in enumerate(prompts):
        groups.setdefault(prompt, []).append(index)
    return list(groups.values())


def build_units(prompt_lengths: list[int], response_lengths: list[int],
                groups: list[list[int]], capacity: int) -> list[list[int]]:
    """Split each group into units of at most ``capacity`` tokens (one prompt copy plus
    the members' responses, first fit in index order).  A member with no response token
    joins no unit (nothing of it is scored)."""
    units: list[list[int]] = []
    for group in groups:
        unit: list[int] = []
        length = 0
        for index in group:
            if response_lengths[index] == 0:
                continue
            if unit and length + response_lengths[index] > capacity:
                units.append(unit)
                unit = []
            if not unit:
                length = prompt_lengths[index]
            unit.append(index)
            length += response_lengths[index]
        if unit:
            units.append(unit)
    return units


def pack_shared_prompts(batch: dict[str, torch.Tensor], capacity: int) -> PackedMicroBatch:
    """Pack a padded micro-batch into rows of prompt-sharing units (module docstring).

    Args:
        batch: ``prompt_ids``/``prompt_mask`` (B, P), left-padded, and
            ``response_ids``/``response_mask`` (B, R), right-padded.
        capacity: the longest unit in tokens (at least the longest sequence).  Rows are no
            longer than the longest unit, as unshared rows are no longer than the longest
            sequence: packing never makes a row's dense attention dearer than its longest
            unit's.

    Returns:
        The layout with ``attention_mask`` ``(rows, 1, row_len, row_len)`` bool.
    """
    prompt_mask = batch["prompt_mask"].detach().cpu().numpy().astype(bool)
    response_mask = batch["response_mask"].detach().cpu().numpy().astype(bool)
    prompt_ids = batch["prompt_ids"].detach().cpu().numpy()
    response_ids = batch["response_ids"].detach().cpu().numpy()
    if (~prompt_mask.any(axis=1) & response_mask.any(axis=1)).any():
        raise ValueError("a response without a prompt token has no logit to predict its "
                         "first token; every row needs at least one prompt token")
    prompts = [tuple(prompt_ids[b][prompt_mask[b]].tolist()) for b in range(len(prompt_ids))]
    responses = [response_ids[b][response_mask[b]] for b in range(len(response_ids))]
    prompt_lengths = [len(p) for p in prompts]
    response_lengths = [len(r) for r in responses]
    longest = max([p + r for p, r in zip(prompt_lengths, response_lengths, strict=True)] + [1])
    capacity = max(capacity, longest)
    units = build_units(prompt_lengths, response_lengths, prompt_groups(prompts), capacity)
    unit_lengths = [prompt_lengths[u[0]] + sum(response_lengths[i] for i in u) for u in units]
    rows = pack_rows(unit_lengths, max(unit_lengths)) if units else []
    row_len = max([sum(unit_lengths[u] for u in row) for row in rows] + [1])
    num_rows = max(len(rows), 1)

    tokens = np.zeros((num_rows, row_len), dtype=np.int64)
    positions = np.zeros((num_rows, row_len), dtype=np.int64)
    unit_of = np.full((num_rows, row_len), -1, dtype=np.int64)  # -1: a row's unused tail
    member_of = np.full((num_rows, row_len), -1, dtype=np.int64)  # -1: the shared prompt
    # (sequence, token index) -> the flat slot whose logit predicts that response token.
    predictor_of: dict[int, np.ndarray] = {}
    for r, row in enumerate(rows):
        col = 0
        for u in row:
            members = units[u]
            prompt = prompts[members[0]]
            p = len(prompt)
            tokens[r, col:col + p] = prompt
            positions[r, col:col + p] = np.arange(p)
            unit_of[r, col:col + p] = u
            last_prompt_slot = r * row_len + col + p - 1
            col += p
            for index in members:
                n = response_lengths[index]
                tokens[r, col:col + n] = responses[index]
                positions[r, col:col + n] = np.arange(p, p + n)
                unit_of[r, col:col + n] = u
                member_of[r, col:col + n] = index
                slots = r * row_len + col + np.arange(n)
                predictor_of[index] = np.concatenate([[last_prompt_slot], slots[:-1]])
                col += n
    # Response tokens in response_mask order (row-major), as the caller unpacks them.
    scored = [b for b in range(len(responses)) if response_lengths[b]]
    predictor = (np.concatenate([predictor_of[b] for b in scored]) if scored else
                 np.zeros(0, dtype=np.int64))
    targets = (np.concatenate([responses[b] for b in scored]) if scored else
               np.zeros(0, dtype=np.int64))

    # Attend: same unit, not later, and the key is the prompt or the query's own response.
    same_unit = (unit_of[:, :, None] == unit_of[:, None, :]) & (unit_of[:, :, None] >= 0)
    own = (member_of[:, None, :] == -1) | (member_of[:, :, None] == member_of[:, None, :])
    causal = np.tril(np.ones((row_len, row_len), dtype=bool))
    allowed = same_unit & own & causal
    allowed |= np.eye(row_len, dtype=bool)  # a tail slot attends itself (no all-masked row)

    device = batch["prompt_ids"].device
    return PackedMicroBatch(
        input_ids=torch.from_numpy(tokens).to(device),
        position_ids=torch.from_numpy(positions).to(device),
        predictor_rows=torch.from_numpy(predictor // row_len).to(device),
        predictor_cols=torch.from_numpy(predictor % row_len).to(device),
        target_ids=torch.from_numpy(targets.astype(np.int64)).to(device),
        response_mask=batch["response_mask"].bool(),
        num_real_tokens=int(sum(unit_lengths)),
        attention_mask=torch.from_numpy(allowed[:, None]).to(device),
    )


def shared_prefix_layout(lm: torch.nn.Module, batch: dict[str, torch.Tensor]
                         ) -> PackedMicroBatch | None:
    """``batch`` packed with shared prompts for ``lm``, or None where that does not pay or
    cannot run: an attention without a custom dense mask (flash-attention's varlen
    kernels, eager, flex), or no two sequences with the same prompt."""
    if attention_implementation(lm) not in SHARED_PREFIX_ATTENTION:
        return None
    prompt_mask = batch["prompt_mask"].bool()
    masked = batch["prompt_ids"].long().masked_fill(~prompt_mask, -1)
    if torch.unique(masked, dim=0).shape[0] == masked.shape[0]:
        return None  # every prompt is different: nothing to share
    config = getattr(lm, "config", None)
    hidden = int(getattr(config, "hidden_size", 0) or 0)
    return pack_shared_prompts(batch, capacity=hidden)
