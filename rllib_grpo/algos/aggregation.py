"""Loss aggregation with verl's [NEW] globally normalised semantics.

``agg_loss`` runs once per **micro-batch**.  Each micro-batch loss is divided by the
count of the **whole mini-batch over all data-parallel ranks** (tokens or sequences,
all-reduced once before the micro-batch loop) and multiplied by ``dp_size``, because
the ranks' gradients are *averaged*.  Then, for every mode::

    mean over ranks r of ( Σ over micro-batches k on rank r of agg_loss(mb_{r,k}) )
        == agg_loss(whole mini-batch, dp_size=1)

exactly, for the value and therefore for the gradient: the result does not depend on
how the mini-batch is split into micro-batches or ranks, nor on dynamic batching.
(verl's legacy [JAN] path normalises per micro-batch, which biases the loss.)

=========================== ===========================================================
mode                        per-micro-batch loss (``m`` mask, ``l`` loss, ``dp`` ranks)
=========================== ===========================================================
``token-mean``              ``Σ_{i,t} m·l / N_tokens · dp``
``token-sum``               ``Σ_{i,t} m·l · dp``
``seq-mean-token-sum``      ``Σ_i Σ_t m·l / N_seqs · dp``
``seq-mean-token-mean``     ``Σ_i (Σ_t m·l / Σ_t m) / N_seqs · dp``
``seq-mean-token-sum-norm`` ``Σ_i Σ_t m·l / N_seqs · dp / horizon`` (Dr.GRPO; [NEW] form:
                            a true sequence mean divided by a constant horizon)
=========================== ===========================================================

``N_tokens = global_num_tokens`` and ``N_seqs = global_num_seqs``.  When they are
``None`` and ``dp_size == 1`` the micro-batch's own counts are used: ``Σ m`` tokens, and
the number of **non-empty** sequences (at least one masked-in token).  The learner passes
both, counted once over the whole mini-batch on all ranks: its ``N_seqs`` is every sampled
response, empty ones included (verl's newer ``global_batch_size``); a zero-weight pass (an
empty token-budget bin that keeps ranks in step) adds nothing to either count.  Every
micro-batch of a mini-batch must get the same counts for the split invariance to hold.
When a needed count is ``None``
and ``dp_size > 1``, ``ValueError`` names the missing argument.  A zero denominator
(an all-empty batch) gives a loss of 0, not NaN.  ``horizon`` defaults to
``loss_mask.shape[-1]``; pass a constant (e.g. ``max_response_length``) so that
micro-batches padded to different lengths are normalised alike.

Losses are aggregated in float32 (or wider) whatever the input precision.
"""

from __future__ import annotations

import torch

from rllib_grpo.algos.functional import masked_mean, masked_sum, safe_div

AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

Count = int | float | torch.Tensor


def _count(
    given: Count | None, local: torch.Tensor, dp_size: int, arg_name: str, mode: str
) -> Count:
    if given is not None:
        return given
    if dp_size > 1:
        raise ValueError(
            f"agg_loss({mode!r}) with dp_size={dp_size} needs {arg_name}: the count over the "
            "whole mini-batch on all ranks (all-reduced before the micro-batch loop)"
        )
    return local


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    mode: str,
    *,
    dp_size: int = 1,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    horizon: Count | None = None,
) -> torch.Tensor:
    """Aggregate a per-token loss of one micro-batch into a scalar (see the module docs).

    Args:
        loss_mat: ``(B, T)`` per-token losses of this micro-batch.
        loss_mask: ``(B, T)``, 1 on tokens that count.
        mode: one of :data:`AGG_MODES`.
        dp_size: number of data-parallel ranks whose gradients are averaged.
        global_num_tokens: ``Σ loss_mask`` over the whole mini-batch on all ranks
            (``token-mean``).
        global_num_seqs: non-empty sequences in the whole mini-batch on all ranks
            (``seq-mean-*``).
        horizon: divisor of ``seq-mean-token-sum-norm`` (default ``loss_mask.shape[-1]``).

    Returns:
        A 0-dim tensor (float32 or wider) carrying the gradient of ``loss_mat``.
    """
    if mode not in AGG_MODES:
        raise ValueError(f"Unknown loss_agg_mode {mode!r}. Known: {', '.join(AGG_MODES)}")
    if int(dp_size) != dp_size or dp_size < 1:
        raise ValueError(f"dp_size must be a positive integer, got {dp_size!r}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"loss_mat {tuple(loss_mat.shape)} and loss_mask {tuple(loss_mask.shape)} differ"
        )
    if loss_mat.dtype in (torch.float16, torch.bfloat16):
        loss_mat = loss_mat.float()
    mask = loss_mask.to(loss_mat.dtype)

    if mode == "token-mean":
        num_tokens = _count(global_num_tokens, mask.sum(), dp_size, "global_num_tokens", mode)
        return safe_div(masked_sum(loss_mat, mask), num_tokens) * dp_size
    if mode == "token-sum":
        return masked_sum(loss_mat, mask) * dp_size

    tokens_per_seq = mask.sum(dim=-1)
    non_empty = (tokens_per_seq > 0).to(loss_mat.dtype)
    num_seqs = _count(global_num_seqs, non_empty.sum(), dp_size, "global_num_seqs", mode)
    if mode == "seq-mean-token-mean":
        seq_losses = masked_mean(loss_mat, mask, dim=-1)  # 0 for empty rows
    else:
        seq_losses = masked_sum(loss_mat, mask, dim=-1)
    loss = safe_div(seq_losses.sum(), num_seqs) * dp_size
    if mode == "seq-mean-token-sum-norm":
        horizon = loss_mask.shape[-1] if horizon is None else horizon
        if not isinstance(horizon, torch.Tensor) and not horizon > 0:
            raise ValueError(f"horizon must be > 0, got {horizon!r}")
        loss = loss / horizon
    return loss
