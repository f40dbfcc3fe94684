"""Rollout batches whose groups were sampled with given policy versions (asynchronous and
continuous sampling tests)."""

from __future__ import annotations


def versioned_batch(versions: list[int], varied: list[bool] | None = None, first_group: int = 0):
    """Groups of 2 trajectories, group g sampled with ``versions[g]``; its two rewards
    differ when ``varied[g]`` (default: all do)."""
    from rllib_grpo.data.rollout import build_rollout_batch

    varied = varied or [True] * len(versions)
    rows = [(g, r) for g in range(len(versions)) for r in range(2)]
    batch = build_rollout_batch(
        [[1, 2]] * len(rows), [[3]] * len(rows), [[-0.5]] * len(rows),
        [float(r) if varied[g] else 0.0 for g, r in rows], [first_group + g for g, _ in rows],
        [False] * len(rows), [False] * len(rows), [{} for _ in rows], pad_token_id=0)
    batch.weights_version[:] = [versions[g] for g, _ in rows]
    return batch
