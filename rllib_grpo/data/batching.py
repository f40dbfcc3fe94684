"""Splitting a mini-batch into micro-batches: fixed size, or to a token budget.

Pure Python/torch (no Ray).  With a token budget (verl ``use_dynamic_bsz``) rows are
balanced over the micro-batches by their token counts with the Karmarkar-Karp
largest-differencing method (as verl's ``get_seqlen_balanced_partitions``), and the
number of micro-batches is the smallest, from ``ceil(total tokens / budget)`` up,
for which *every* micro-batch holds at most the budget: the budget bounds what one
forward pass holds (with padding removal, its packed row length: the memory).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence


def split_fixed(num_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Row indices of consecutive micro-batches of ``micro_batch_size`` rows."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size must be >= 1, got {micro_batch_size}")
    return [
        list(range(start, min(start + micro_batch_size, num_rows)))
        for start in range(0, num_rows, micro_batch_size)
    ]


def karmarkar_karp(seq_lengths: Sequence[int], num_bins: int) -> list[list[int]]:
    """Partition rows into ``num_bins`` bins of near-equal token sums (largest differencing).

    Every bin gets at least one row when there are enough rows.  Indices inside a bin
    are sorted and ties are broken by index, so results are deterministic.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be >= 1, got {num_bins}")
    # A state is num_bins (sum, rows) pairs, sorted by sum, largest first.
    heap: list[tuple[int, int, list[tuple[int, list[int]]]]] = []
    order = sorted(range(len(seq_lengths)), key=lambda i: (seq_lengths[i], i))
    for count, row in enumerate(order):
        state = [(seq_lengths[row], [row])] + [(0, []) for _ in range(num_bins - 1)]
        heapq.heappush(heap, (-seq_lengths[row], count, state))
    count = len(order)
    while len(heap) > 1:  # merge the two states of largest spread, largest bin to smallest
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second),
                                                              strict=True)]
        merged.sort(key=lambda part: (-part[0], min(part[1], default=-1)))
        count += 1
        heapq.heappush(heap, (merged[-1][0] - merged[0][0], count, merged))
    bins = [list(rows) for _, rows in heap[0][2]] if heap else [[] for _ in range(num_bins)]
    _fill_empty_bins(bins, seq_lengths)
    return [sorted(b) for b in bins]


def _fill_empty_bins(bins: list[list[int]], seq_lengths: Sequence[int]) -> None:
    """Move rows into empty bins (from the fullest bin with >= 2 rows): loads only drop."""
    while True:
        empty = [b for b in bins if not b]
        donors = [b for b in bins if len(b) > 1]
        if not empty or not donors:
            return
        donor = max(donors, key=lambda b: sum(seq_lengths[i] for i in b))
        shortest = min(donor, key=lambda i: (seq_lengths[i], i))
        donor.remove(shortest)
        empty[0].append(shortest)


def _largest_bin(bins: list[list[int]], seq_lengths: Sequence[int]) -> int:
    return max((sum(seq_lengths[i] for i in b) for b in bins), default=0)


def num_micro_batches_for_budget(seq_lengths: Sequence[int], max_tokens: int) -> int:
    """How many micro-batches a token budget needs: the fewest (from ``ceil(sum / budget)``,
    at most one per row) whose Karmarkar-Karp bins all hold at most ``max_tokens`` tokens.

    Raises ``ValueError`` when a single sequence is longer than the budget.
    """
    longest = max(seq_lengths, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"max_tokens_per_micro_batch={max_tokens} is below the longest sequence "
            f"({longest} tokens); raise it to at least {longest}."
        )
    num = max(1, min(len(seq_lengths), math.ceil(sum(seq_lengths) / max_tokens)))
    while num < len(seq_lengths) and _largest_bin(karmarkar_karp(seq_lengths, num),
                                                  seq_lengths) > max_tokens:
        num += 1
    return num


def split_token_budget(seq_lengths: Sequence[int], num_micro_batches: int,
                       max_tokens: int | None = None) -> list[list[int]]:
    """Balance rows over ``num_micro_batches`` bins by token count (Karmarkar-Karp).

    Every bin gets at least one row when there are enough rows; bins may be empty
    only when ``num_micro_batches > len(seq_lengths)`` (the caller pads them).
    With ``max_tokens``, no bin holds more (``num_micro_batches`` must be at least
    `num_micro_batches_for_budget`, e.g. its maximum over learners): when the balanced
    split of this many bins overshoots, the fewest bins that fit are split further.
    Indices inside a bin are sorted, so results are deterministic.
    """
    bins = karmarkar_karp(seq_lengths, num_micro_batches)
    if max_tokens is None or _largest_bin(bins, seq_lengths) <= max_tokens:
        return bins
    fewest = num_micro_batches_for_budget(seq_lengths, max_tokens)
    if fewest > num_micro_batches:
        raise ValueError(f"{num_micro_batches} micro-batches cannot hold these rows within "
                         f"{max_tokens} tokens each; at least {fewest} are needed.")
    bins = karmarkar_karp(seq_lengths, fewest) + [[] for _ in range(num_micro_batches - fewest)]
    _fill_empty_bins(bins, seq_lengths)
    return [sorted(b) for b in bins]
