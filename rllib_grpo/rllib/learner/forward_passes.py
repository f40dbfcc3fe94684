"""The learner's no-grad forward passes before an update: the old log-probs (and entropy)
and the reference's log-probs, on the update's own micro-batches."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from rllib_grpo.models.vision_forward import VISION_COLUMN
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.staleness import old_log_probs_from_update
from rllib_grpo.rllib.learner.micro_batches import select_rows, sequence_lengths, step_micro_batches
from rllib_grpo.rllib.learner.module import CausalLMRLModule, response_log_probs
from rllib_grpo.rllib.learner.perf import PhaseTimes

# What a forward pass reads from the batch (``multi_modal_inputs``: rows with images only).
FORWARD_COLUMNS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask", VISION_COLUMN)


def forward_columns(batch: dict) -> dict:
    """The columns of ``batch`` a forward pass reads."""
    return {k: batch[k] for k in FORWARD_COLUMNS if k in batch}


def old_and_reference_log_probs(module: CausalLMRLModule, batch: dict[str, torch.Tensor],
                                config: GRPOSettings, device: torch.device,
                                phase_times: PhaseTimes) -> dict[str, torch.Tensor]:
    """The no-grad forward passes before the update, each (B, R) over ``batch``'s rows:
    ``old_log_probs`` and ``entropy`` at the sampling temperature (none when the
    update's own forward gives them, `old_log_probs_from_update`) and ``ref_log_probs``
    (only when a KL term needs the reference).

    They run on the update's micro-batches, mini-batch by mini-batch (the same count on
    every learner: sharded forwards are collective); rows come back in place.  Eval
    mode (no dropout) as verl's compute_log_prob; forward_train sets train() again.
    """
    c = config
    mask = batch["response_mask"].float()
    old, entropy = torch.zeros_like(mask), torch.zeros_like(mask)
    ref = torch.zeros_like(mask) if c.needs_reference else None
    old_pass = not old_log_probs_from_update(c)
    lengths = sequence_lengths(batch)
    module.eval()
    # A host-offloaded reference visits the device once for the whole pass.
    with module.reference_on(device) if ref is not None else nullcontext():
        for rows in step_micro_batches(batch, c, device):
            micro = select_rows(forward_columns(batch), rows or [0])
            tokens = float(lengths[rows].sum()) if rows else 0.0
            if old_pass:
                with phase_times.phase("old_log_prob", tokens), module.autocast():
                    out = response_log_probs(module.lm, micro, c.temperature, with_entropy=True,
                                             packed=c.use_remove_padding,
                                             token_stats=module.token_stats)
            ref_out = None
            if ref is not None:
                with phase_times.phase("ref", tokens):
                    ref_out = module.reference_log_probs(micro, packed=c.use_remove_padding)
            if not rows:  # an empty token-budget bin: the pass only keeps ranks in step
                continue
            index = torch.as_tensor(rows, device=mask.device)
            if old_pass:
                old[index] = out["log_probs"]
                entropy[index] = out["entropy"]
            if ref is not None and ref_out is not None:
                ref[index] = ref_out
    passes = {} if ref is None else {"ref_log_probs": ref}
    if old_pass:
        passes.update(old_log_probs=old, entropy=entropy)
    return passes
