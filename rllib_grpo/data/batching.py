"""Splitting a mini-batch into micro-batches: fixed size, or to a token budget.

Pure Python/torch (no Ray).  With a token budget (verl ``use_dynamic_bsz``) the
number of micro-batches is ``ceil(total tokens / budget)`` (the caller makes it
equal on every learner), and rows are balanced over them by longest-first
greedy assignment, which, like verl's Karmarkar-Karp, balances the workload but
does not strictly cap any one micro-batch.
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


def num_micro_batches_for_budget(seq_lengths: Sequence[int], max_tokens: int) -> int:
    """How many micro-batches a token budget needs: ``ceil(sum / budget)``, at most one per row.

    Raises ``ValueError`` when a single sequence is longer than the budget.
    """
    longest = max(seq_lengths, default=0)
    if longest > max_tokens:
        raise ValueError(
            f"max_tokens_per_micro_batch={max_tokens} is below the longest sequence "
            f"({longest} tokens); raise it to at least {longest}."
        )
    total = sum(seq_lengths)
    return max(1, min(len(seq_lengths), math.ceil(total / max_tokens)))


def split_token_budget(seq_lengths: Sequence[int], num_micro_batches: int) -> list[list[int]]:
    """Balance rows over ``num_micro_batches`` bins by token count (longest first).

    Every bin gets at least one row when there are enough rows; bins may be empty
    only when ``num_micro_batches > len(seq_lengths)`` (the caller pads them).
    Indices inside a bin are sorted, so results are deterministic.
    """
    bins: list[list[int]] = [[] for _ in range(num_micro_batches)]
    heap = [(0, b) for b in range(num_micro_batches)]
    order = sorted(range(len(seq_lengths)), key=lambda i: (-seq_lengths[i], i))
    for row in order:
        load, b = heapq.heappop(heap)
        bins[b].append(row)
        heapq.heappush(heap, (load + seq_lengths[row], b))
    return [sorted(b) for b in bins]
