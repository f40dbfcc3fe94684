"""Driver-side recipe logic on `RolloutBatch`es (no Ray): DAPO dynamic sampling and
verl's validation metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from rllib_grpo.data.rollout import RolloutBatch


@dataclass
class GroupFilterStats:
    """What one generation batch contributed under dynamic sampling (counts in groups)."""

    kept: int = 0
    dropped_all_right: int = 0
    dropped_all_wrong: int = 0
    dropped_other: int = 0


# Per-trajectory metrics dynamic sampling can filter on (verl's filter_groups.metric).
FILTER_METRICS = ("acc", "score", "seq_reward")


def filter_groups(batch: RolloutBatch, metric: str) -> tuple[RolloutBatch, GroupFilterStats]:
    """Keep the groups whose ``metric`` varies (DAPO), or that have a single sample.

    Variance is ``np.std`` (population), as in verl's recipe.  A dropped group is
    "all right" when every sample's ``acc`` (else score > 0) is true, "all wrong"
    when none is.
    """
    values = batch.metric(metric)
    right = np.asarray([bool(i.get("acc", s > 0)) for i, s in zip(batch.infos, batch.scores,
                                                                   strict=True)])
    stats, keep_rows = GroupFilterStats(), []
    for g in _groups_in_order(batch.group_index):
        rows = np.flatnonzero(batch.group_index == g)
        if len(rows) == 1 or np.std(values[rows]) > 0:
            stats.kept += 1
            keep_rows.extend(rows.tolist())
        elif right[rows].all():
            stats.dropped_all_right += 1
        elif not right[rows].any():
            stats.dropped_all_wrong += 1
        else:
            stats.dropped_other += 1
    return batch.select(keep_rows), stats


def first_groups(batch: RolloutBatch, num_groups: int) -> RolloutBatch:
    """The first ``num_groups`` whole groups of ``batch`` (surplus discarded, as DAPO does)."""
    order = _groups_in_order(batch.group_index)[:num_groups]
    rows = [r for g in order for r in np.flatnonzero(batch.group_index == g).tolist()]
    return batch.select(rows)


def _groups_in_order(group_index: np.ndarray) -> list[int]:
    _, first = np.unique(group_index, return_index=True)
    return [int(group_index[i]) for i in sorted(first)]


@dataclass
class ValidationSample:
    """One held-out response: its prompt, data source and reward info."""

    prompt_index: int
    data_source: str
    score: float
    acc: float | None = None
    pred: str | None = None
    has_pred: bool = False  # the reward function reports a prediction (None = unparsed)
    extra: dict = field(default_factory=dict)


def _groups_by_source(samples: list[ValidationSample]
                      ) -> Iterator[tuple[str, list[list[ValidationSample]], int, bool]]:
    """Per data source: its prompts' sample groups, N (the fewest samples of a prompt), and
    whether every sample reports ``acc`` (else the metrics use ``reward``)."""
    by_source: dict[str, dict[int, list[ValidationSample]]] = {}
    for s in samples:
        by_source.setdefault(s.data_source, {}).setdefault(s.prompt_index, []).append(s)
    for source, prompts in by_source.items():
        groups = list(prompts.values())
        yield (source, groups, min(len(g) for g in groups),
               all(s.acc is not None for g in groups for s in g))


def validation_metrics(samples: list[ValidationSample]) -> dict[str, float]:
    """verl's ``val-core`` metrics per data source: ``{var}/mean@N``, ``best@N/mean`` and
    (when the reward function reports ``pred``) ``maj@N/mean``.  ``var`` is ``acc`` when
    reported, else ``reward``; N is the number of samples per prompt."""
    metrics: dict[str, float] = {}
    for source, groups, n, use_acc in _groups_by_source(samples):
        var = "acc" if use_acc else "reward"
        values = [[float(s.acc) if use_acc and s.acc is not None else s.score for s in g[:n]]
                  for g in groups]
        prefix = f"val-core/{source}/{var}"
        metrics[f"{prefix}/mean@{n}"] = float(np.mean([np.mean(v) for v in values]))
        if n > 1:
            metrics[f"{prefix}/best@{n}/mean"] = float(np.mean([np.max(v) for v in values]))
            if all(s.has_pred for g in groups for s in g):
                metrics[f"{prefix}/maj@{n}/mean"] = float(np.mean([
                    _majority_value(g[:n], use_acc) for g in groups]))
    return metrics


def _majority_value(group: list[ValidationSample], use_acc: bool) -> float:
    """The value of the most common prediction (first seen wins ties; an unparsed
    answer, ``None``, is a vote like any other)."""
    counts = Counter(s.pred for s in group)
    top = max(counts.values())
    winner = next(s for s in group if counts[s.pred] == top)
    return float(winner.acc) if use_acc and winner.acc is not None else winner.score


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples of which ``c`` are right (Chen et al. 2021, the
    HumanEval estimator): the chance that ``k`` of the ``n``, drawn without replacement,
    hold at least one right one, ``1 - C(n-c, k) / C(n, k)``."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # The product form of the binomial ratio: no overflow for large n.
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def pass_at_k_metrics(samples: list[ValidationSample]) -> dict[str, float]:
    """``val-core/<source>/<var>/pass@k/mean`` for k = 1, 2, 4, ... and N (samples per
    prompt), by the unbiased estimator averaged over prompts.  A sample is right when its
    ``acc`` is true (``var`` = ``acc``), else when its score is above 0 (``reward``)."""
    metrics: dict[str, float] = {}
    for source, groups, n, use_acc in _groups_by_source(samples):
        var = "acc" if use_acc else "reward"
        right = [sum(bool(s.acc) if use_acc else s.score > 0 for s in g[:n]) for g in groups]
        ks = sorted({*(2**i for i in range(n.bit_length()) if 2**i <= n), n})
        for k in ks:
            metrics[f"val-core/{source}/{var}/pass@{k}/mean"] = float(
                np.mean([pass_at_k(n, c, k) for c in right]))
    return metrics
