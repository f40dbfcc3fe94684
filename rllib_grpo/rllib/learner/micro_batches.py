"""Which rows share a forward pass on a learner, for every pass of a training step.

The old-log-prob and reference passes (`GRPOLearner._old_and_reference_log_probs`, over
the whole batch) and the update (one mini-batch at a time, from RLlib's iterator) use the
same micro-batches:
the batch is cut into the mini-batches RLlib's ``MiniBatchCyclicIterator`` yields in the
first epoch (consecutive runs of ``trajectories_per_minibatch_per_learner`` rows), and each
mini-batch is split by `micro_batches` alone.  With a token budget every micro-batch
holds at most ``max_tokens_per_micro_batch`` real tokens (Karmarkar-Karp balanced, the
same count on every learner: sharded forwards are collective).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rllib_grpo.data.batching import num_micro_batches_for_budget, split_fixed, split_token_budget
from rllib_grpo.rllib.learner.distributed import all_reduce


def select_rows(batch: dict[str, Any], rows: list[int] | torch.Tensor) -> dict:
    """The rows ``rows`` of every column of ``batch`` (tensors, and the numpy object
    column of the rows' images)."""
    idx = torch.as_tensor(rows, dtype=torch.long)
    return {k: v[idx.cpu().numpy()] if isinstance(v, np.ndarray) else v.index_select(0, idx.to(v.device))
            for k, v in batch.items()}


@dataclasses.dataclass(frozen=True)
class MiniBatchTotals:
    """Global counts of one mini-batch (all learners) that normalise every micro-batch's loss,
    so the update does not depend on how the mini-batch was split (`rllib_grpo.algos.agg_loss`)."""

    dp_size: int
    global_num_tokens: float
    global_num_seqs: float
    horizon: float

    def agg_kwargs(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def sequence_lengths(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Real tokens (prompt + response) of every row."""
    return batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)


def micro_batches(minibatch: dict[str, torch.Tensor], config: Any,
                  device: torch.device) -> list[list[int]]:
    """Row indices of each micro-batch of one mini-batch (collective with a token budget)."""
    n = len(minibatch["scores"])
    if not config.micro_batches_by_tokens:
        return split_fixed(n, config.batch_plan().micro_batch_size_per_learner or n)
    lengths = sequence_lengths(minibatch).long().tolist()
    budget = config.max_tokens_per_micro_batch
    num = num_micro_batches_for_budget(lengths, budget)
    # Every learner must run the same number of forward/backward passes.
    # On the learner's device: NCCL (GPU learners) reduces no CPU tensors.
    num = int(all_reduce(torch.tensor(num, device=device), dist.ReduceOp.MAX).item())
    return split_token_budget(lengths, num, budget)


def step_micro_batches(batch: dict[str, torch.Tensor], config: Any,
                       device: torch.device) -> list[list[int]]:
    """The update's micro-batches of every mini-batch of ``batch`` (first epoch), as row
    indices of ``batch``: what the old-log-prob and reference passes run on."""
    n = len(batch["scores"])
    size = config.batch_plan().trajectories_per_minibatch_per_learner or n
    out: list[list[int]] = []
    for start in range(0, n, size):
        minibatch = {k: v[start:start + size] for k, v in batch.items()}
        out += [[start + row for row in rows] for rows in micro_batches(minibatch, config, device)]
    return out


