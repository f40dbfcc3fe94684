"""Masked reductions, log-prob/entropy helpers and group statistics (pure torch).

Shapes: ``B`` responses, ``T`` response tokens, ``V`` vocabulary entries, ``G`` groups.
Masks are ``(B, T)`` with 1 on response tokens and 0 on padding or observation tokens;
bool, integer and float masks all work.  Values under a zero mask are never read, so
padding may hold garbage (``nan``/``inf``) without poisoning results or gradients.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable

import torch

# Matches verl's ``masked_whiten``: added to the variance before ``rsqrt``.
WHITEN_EPS = 1e-8


def safe_div(numerator: torch.Tensor, denominator: torch.Tensor | float) -> torch.Tensor:
    """``numerator / denominator`` where the denominator is nonzero, else 0.

    Gradients stay finite: the zero branch never divides by zero.
    """
    denominator = torch.as_tensor(denominator, dtype=numerator.dtype, device=numerator.device)
    is_zero = denominator == 0
    safe = torch.where(is_zero, torch.ones_like(denominator), denominator)
    return torch.where(is_zero, torch.zeros_like(numerator / safe), numerator / safe)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values * mask`` over ``dim`` (all elements when ``None``)."""
    # ``where`` first so that nan/inf under mask==0 cannot leak through ``0 * inf``.
    masked = torch.where(mask.bool(), values, torch.zeros_like(values)) * mask
    return masked.sum() if dim is None else masked.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the masked elements; 0 where the mask is empty.

    verl divides by ``mask.sum() + 1e-8``; dividing by the exact count (guarded) gives
    the same numbers in float32 and exact ones in float64.
    """
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return safe_div(masked_sum(values, mask, dim), count.to(values.dtype))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all masked elements (a 0-dim tensor).

    With ``unbiased=True`` the Bessel factor ``N/(N-1)`` is applied, so a mask with
    fewer than two elements raises ``ValueError`` (as verl does).
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        mask_sum = float(mask.sum())
        if mask_sum == 0:
            raise ValueError("masked_var: the mask is empty; at least one element must be 1.")
        if mask_sum == 1:
            raise ValueError(
                "masked_var: the mask sums to one, so the unbiased variance divides by zero."
            )
        variance = variance * (mask_sum / (mask_sum - 1))
    return variance


ReduceSum = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over every shard of the batch (an all-reduce over the learners)."""


def sharded_masked_mean_var(values: torch.Tensor, mask: torch.Tensor,
                            reduce_sum: ReduceSum) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked mean and unbiased variance over a batch split in shards, each shard holding
    ``values``/``mask`` and ``reduce_sum`` summing over the shards (two reductions: the
    mean first, then squared deviations from it, as one pass over the whole batch would).
    """
    totals = reduce_sum(torch.stack([masked_sum(values, mask),
                                     mask.sum().to(values.dtype)]))
    mean, count = safe_div(totals[0], totals[1]), float(totals[1])
    if count < 2:
        raise ValueError(f"masked variance over the whole batch needs two or more masked "
                         f"elements; the mask sums to {count:g}.")
    squares = reduce_sum(masked_sum((values - mean) ** 2, mask).reshape(1))[0]
    return mean, squares / (count - 1)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True,
    reduce_sum: ReduceSum | None = None,
) -> torch.Tensor:
    """``(values - mean) * rsqrt(var + 1e-8)`` with batch-global masked statistics.

    The variance is unbiased (see :func:`masked_var`).  With ``shift_mean=False`` the
    mean is added back, i.e. only the scale is normalised.  When the batch is split over
    learners, ``reduce_sum`` (a sum over them) makes the statistics the whole batch's.
    """
    if reduce_sum is None:
        mean = masked_mean(values, mask)
        variance = masked_var(values, mask, unbiased=True)
    else:
        mean, variance = sharded_masked_mean_var(values, mask, reduce_sum)
    whitened = (values - mean) * torch.rsqrt(variance + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmax statistics in 16-bit floats lose most of their precision.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` along the last axis: ``logsumexp(z) - Σ softmax(z)·z``.

    Args:
        logits: ``(..., V)``; already divided by the sampling temperature.
        chunk_size: rows processed at once (``None`` = all), bounding the ``(rows, V)``
            temporaries.

    Returns:
        ``(...)`` entropies, float32 for 16-bit inputs, else ``logits.dtype``.
    """

    def _entropy(rows: torch.Tensor) -> torch.Tensor:
        rows = rows.to(_compute_dtype(rows.dtype))
        probs = torch.softmax(rows, dim=-1)
        return torch.logsumexp(rows, dim=-1) - (probs * rows).sum(dim=-1)

    return _by_row_chunks(_entropy, logits, chunk_size)


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = 1024
) -> torch.Tensor:
    """``log_softmax(logits)[..., labels]`` without materialising the full log-softmax.

    Computes ``z[label] - logsumexp(z)`` a chunk of rows at a time, so the only
    ``(rows, V)`` temporary is the one inside ``logsumexp`` for one chunk.

    Args:
        logits: ``(..., V)``.
        labels: ``(...)`` integer token ids.
        chunk_size: rows per chunk (``None`` = all rows at once).

    Returns:
        ``(...)`` log-probabilities, float32 for 16-bit inputs, else ``logits.dtype``.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels shape {tuple(labels.shape)} must equal logits.shape[:-1] "
            f"{tuple(logits.shape[:-1])}"
        )
    compute_dtype = _compute_dtype(logits.dtype)
    flat_labels = labels.reshape(-1, 1).long()

    def _logprobs(rows: torch.Tensor, row_labels: torch.Tensor) -> torch.Tensor:
        rows = rows.to(compute_dtype)
        picked = rows.gather(-1, row_labels).squeeze(-1)
        return picked - torch.logsumexp(rows, dim=-1)

    flat_logits = logits.reshape(-1, logits.shape[-1])
    num_rows = flat_logits.shape[0]
    step = num_rows if chunk_size is None else max(int(chunk_size), 1)
    if num_rows <= step:
        return _logprobs(flat_logits, flat_labels).reshape(labels.shape)
    pieces = [
        _logprobs(flat_logits[i : i + step], flat_labels[i : i + step])
        for i in range(0, num_rows, step)
    ]
    return torch.cat(pieces).reshape(labels.shape)


def _by_row_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, chunk_size: int | None
) -> torch.Tensor:
    """Apply a row-wise ``(N, V) -> (N,)`` function to ``(..., V)`` a chunk at a time."""
    flat = x.reshape(-1, x.shape[-1])
    if chunk_size is None or flat.shape[0] <= chunk_size:
        return fn(flat).reshape(x.shape[:-1])
    step = max(int(chunk_size), 1)
    pieces = [fn(flat[i : i + step]) for i in range(0, flat.shape[0], step)]
    return torch.cat(pieces).reshape(x.shape[:-1])


# --------------------------------------------------------------------------- groups


def group_index(
    group_ids: Iterable[Hashable] | torch.Tensor,
    batch_size: int | None = None,
    device: torch.device | str | None = None,
) -> tuple[torch.Tensor, int]:
    """Map hashable group ids (strings, ints, a numpy array, a 1-D tensor) to ``0..G-1``.

    Groups are numbered in order of first appearance, so ``["b", "a", "b"]`` gives
    ``[0, 1, 0]``.

    Returns:
        ``(index, num_groups)``: a ``(B,)`` long tensor and ``G``.
    """
    if isinstance(group_ids, torch.Tensor) or hasattr(group_ids, "tolist"):
        if getattr(group_ids, "ndim", 1) != 1:
            raise ValueError(f"group_ids must be 1-D, got shape {tuple(group_ids.shape)}")  # type: ignore[union-attr]
        group_ids = group_ids.tolist()
    numbering: dict[Hashable, int] = {}
    index = [numbering.setdefault(gid, len(numbering)) for gid in group_ids]
    if batch_size is not None and len(index) != batch_size:
        raise ValueError(f"got {len(index)} group ids for a batch of {batch_size} responses")
    return torch.tensor(index, dtype=torch.long, device=device), len(numbering)


def _stats_dtype(device: torch.device) -> torch.dtype:
    # Group statistics in float64 where the device has it (MPS does not).
    return torch.float32 if device.type == "mps" else torch.float64


def group_stats(
    values: torch.Tensor, index: torch.Tensor, num_groups: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, unbiased std and count of ``values`` ``(B,)`` given ``index`` ``(B,)``.

    verl's conventions: a singleton group has mean 0 and std 1.  Statistics are taken
    around each group's first value (the shifted-data algorithm) in float64, so a group
    whose values are all equal gets *exactly* its value as mean and 0 as std, and
    ``values - mean`` is exactly 0 for it.

    Returns:
        ``(mean, std, count)``, each ``(G,)``; mean/std in the statistics dtype
        (float64 except on MPS), count as long.
    """
    dtype = _stats_dtype(values.device)
    x = values.detach().to(dtype)
    index = index.to(x.device)
    count = torch.bincount(index, minlength=num_groups)
    positions = torch.arange(x.shape[0], device=x.device)
    first = torch.full((num_groups,), x.shape[0], dtype=torch.long, device=x.device)
    first = first.scatter_reduce(0, index, positions, reduce="amin", include_self=True)
    reference = x[first]  # every numbered group has a member, so ``first`` is valid
    shifted = x - reference[index]
    n = count.to(dtype)
    shifted_mean = safe_div(
        torch.zeros(num_groups, dtype=dtype, device=x.device).index_add_(0, index, shifted), n
    )
    deviation = shifted - shifted_mean[index]
    sum_sq = torch.zeros(num_groups, dtype=dtype, device=x.device).index_add_(
        0, index, deviation**2
    )
    std = torch.sqrt(safe_div(sum_sq, n - 1))
    singleton = count <= 1
    mean = torch.where(singleton, torch.zeros_like(reference), reference + shifted_mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    return mean, std, count


def group_mean_std(
    values: torch.Tensor, group_ids: Iterable[Hashable] | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """verl's ``group_mean_std``: per-group mean, unbiased std (singleton: 0 and 1), count.

    Groups are ordered by first appearance in ``group_ids``; mean/std come back in
    ``values.dtype``.
    """
    index, num_groups = group_index(group_ids, values.shape[0], values.device)
    mean, std, count = group_stats(values, index, num_groups)
    return mean.to(values.dtype), std.to(values.dtype), count
