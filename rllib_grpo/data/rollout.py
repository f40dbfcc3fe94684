"""`RolloutBatch`: what an env runner returns for a set of prompt groups.

Padded numpy arrays, one row per trajectory, groups contiguous
(``[p0, p0, ..., p1, p1, ...]``, verl's interleaved repeat), plus per-sample
reward info.  Units: ``prompt_*`` columns are (trajectories, prompt tokens),
``response_*`` columns (trajectories, response tokens), the rest per trajectory;
``weights_version`` is the policy version (learner updates done) the sampler held.
No Ray and no torch here; the driver concatenates batches and the learner reads
the columns.

Multi-turn episodes (`rllib_grpo.data.trajectory`) put the environment's tokens in
the response too, with ``response_mask`` 1 (they are attended to) and the optional
``loss_mask`` 0 (they are not trained on); single-turn batches have no ``loss_mask``.

Prompts with images: ``multi_modal_inputs`` (verl's name) holds per trajectory its
prompt's `rllib_grpo.data.images.VisionInputs` (None for a row without images), a numpy
object column whose rows of one group share one object; text-only batches have none.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rllib_grpo.data.trajectory import episode_metrics

ARRAY_FIELDS = (
    "prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_log_probs",
    "scores", "group_index", "response_lengths", "prompt_lengths", "truncated",
    "reward_errors", "reward_baselines", "weights_version",
)


@dataclass
class RolloutBatch:
    """A batch of trajectories, groups contiguous.  See the module docstring for units."""

    prompt_ids: np.ndarray
    prompt_mask: np.ndarray
    response_ids: np.ndarray
    response_mask: np.ndarray
    rollout_log_probs: np.ndarray
    scores: np.ndarray
    group_index: np.ndarray
    response_lengths: np.ndarray
    prompt_lengths: np.ndarray
    truncated: np.ndarray
    reward_errors: np.ndarray
    reward_baselines: np.ndarray
    # Per trajectory: the policy version (learner updates done) of the weights that sampled it.
    weights_version: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)
    # (trajectories, response tokens): 1 on the model's own tokens; None = response_mask.
    loss_mask: np.ndarray | None = None
    # (trajectories, response tokens): the weights version that sampled each token
    # (continuous rollouts, whose responses may span a weight update); None = one version
    # per trajectory (``weights_version``), the synchronous and one-step-off paths.
    token_versions: np.ndarray | None = None
    # (trajectories,) objects: each row's VisionInputs (None: no images); None: no row has any.
    multi_modal_inputs: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def num_groups(self) -> int:
        return len(np.unique(self.group_index))

    def select(self, rows: Sequence[int] | np.ndarray) -> RolloutBatch:
        """The batch restricted to ``rows`` (in that order)."""
        rows = np.asarray(rows, dtype=np.int64)
        columns = {name: getattr(self, name)[rows] for name in ARRAY_FIELDS}
        loss_mask = None if self.loss_mask is None else self.loss_mask[rows]
        versions = None if self.token_versions is None else self.token_versions[rows]
        vision = None if self.multi_modal_inputs is None else self.multi_modal_inputs[rows]
        return RolloutBatch(**columns, infos=[self.infos[i] for i in rows], loss_mask=loss_mask,
                            token_versions=versions, multi_modal_inputs=vision)

    def per_token_versions(self) -> np.ndarray:
        """(trajectories, response tokens): each token's weights version (``weights_version``
        broadcast where the batch has no ``token_versions``)."""
        if self.token_versions is not None:
            return self.token_versions
        return np.broadcast_to(self.weights_version[:, None], self.response_ids.shape).copy()

    def metric(self, name: str) -> np.ndarray:
        """A per-trajectory value, as verl's ``filter_groups.metric`` reads it.

        ``seq_reward`` is the reward the learner gets (``scores``: after DAPO's overlong
        penalty); ``score`` is the reward function's own value (``info["score"]``, before
        the penalty; ``scores`` when the env reports none); any other name is an info key
        (``acc``).
        """
        if name == "seq_reward" or (name == "score" and not any(
                "score" in info for info in self.infos)):
            return self.scores.astype(np.float64)
        if not all(name in info for info in self.infos):
            raise ValueError(
                f"filter_groups_metric={name!r}: the reward function does not report it for "
                "every sample; use 'score' or a key its result dict has (e.g. 'acc')."
            )
        return np.asarray([float(info[name]) for info in self.infos])

    def train_columns(self) -> dict[str, np.ndarray]:
        """The numeric columns the learner consumes (and ``loss_mask`` and
        ``multi_modal_inputs`` when there are)."""
        columns = {k: getattr(self, k) for k in ARRAY_FIELDS}
        if self.loss_mask is not None:
            columns["loss_mask"] = self.loss_mask
        if self.multi_modal_inputs is not None:
            columns["multi_modal_inputs"] = self.multi_modal_inputs
        return columns


def _pad(rows: Sequence[Sequence[float]], width: int, value: float, left: bool, dtype) -> np.ndarray:
    out = np.full((len(rows), max(width, 1)), value, dtype=dtype)
    for i, row in enumerate(rows):
        if len(row):
            if left:
                out[i, width - len(row):] = row
            else:
                out[i, : len(row)] = row
    return out


def build_rollout_batch(
    prompt_ids: Sequence[Sequence[int]],
    response_ids: Sequence[Sequence[int]],
    response_log_probs: Sequence[Sequence[float]],
    scores: Sequence[float],
    group_index: Sequence[int],
    truncated: Sequence[bool],
    reward_errors: Sequence[bool],
    infos: list[dict[str, Any]],
    *,
    pad_token_id: int,
    reward_baselines: Sequence[float] | None = None,
    loss_masks: Sequence[Sequence[float]] | None = None,
    multi_modal_inputs: Sequence[Any] | None = None,
) -> RolloutBatch:
    """Pad per-trajectory lists into a `RolloutBatch` (prompts left-, responses right-padded).

    ``loss_masks`` (multi-turn): per response token, 1 where the model's own tokens are.
    ``multi_modal_inputs``: per trajectory its prompt's vision inputs or None (a batch
    where every row has None carries no column).
    """
    prompt_width = max((len(p) for p in prompt_ids), default=1)
    response_width = max((len(r) for r in response_ids), default=1)
    loss_mask = None if loss_masks is None else _pad(loss_masks, response_width, 0, False,
                                                     np.float32)
    return RolloutBatch(
        prompt_ids=_pad(prompt_ids, prompt_width, pad_token_id, True, np.int64),
        prompt_mask=_pad([[1] * len(p) for p in prompt_ids], prompt_width, 0, True, np.int64),
        response_ids=_pad(response_ids, response_width, pad_token_id, False, np.int64),
        response_mask=_pad([[1] * len(r) for r in response_ids], response_width, 0, False,
                           np.float32),
        rollout_log_probs=_pad(response_log_probs, response_width, 0.0, False, np.float32),
        scores=np.asarray(scores, dtype=np.float32),
        group_index=np.asarray(group_index, dtype=np.int64),
        response_lengths=np.asarray([len(r) for r in response_ids], dtype=np.int64),
        prompt_lengths=np.asarray([len(p) for p in prompt_ids], dtype=np.int64),
        truncated=np.asarray(truncated, dtype=bool),
        reward_errors=np.asarray(reward_errors, dtype=bool),
        reward_baselines=np.asarray(
            reward_baselines if reward_baselines is not None else np.zeros(len(scores)),
            dtype=np.float32),
        weights_version=np.zeros(len(scores), dtype=np.int64),
        infos=infos,
        loss_mask=loss_mask,
        multi_modal_inputs=vision_column(multi_modal_inputs),
    )


def vision_column(rows: Sequence[Any] | None) -> np.ndarray | None:
    """Per-row vision inputs as a numpy object column; None where no row has any."""
    if rows is None or all(row is None for row in rows):
        return None
    column = np.empty(len(rows), dtype=object)
    column[:] = list(rows)
    return column


def _repad(array: np.ndarray, width: int, value: float, left: bool) -> np.ndarray:
    missing = width - array.shape[1]
    if missing <= 0:
        return array
    pad = np.full((array.shape[0], missing), value, dtype=array.dtype)
    return np.concatenate([pad, array] if left else [array, pad], axis=1)


def concat_rollouts(batches: Sequence[RolloutBatch], *, pad_token_id: int) -> RolloutBatch:
    """Concatenate batches (re-padding to the widest) and renumber groups 0..G-1."""
    prompt_width = max(b.prompt_ids.shape[1] for b in batches)
    response_width = max(b.response_ids.shape[1] for b in batches)
    columns: dict[str, Any] = {}
    for name in ARRAY_FIELDS:
        parts = [getattr(b, name) for b in batches]
        if name in ("prompt_ids", "prompt_mask"):
            value = pad_token_id if name == "prompt_ids" else 0
            parts = [_repad(p, prompt_width, value, left=True) for p in parts]
        elif name in ("response_ids", "response_mask", "rollout_log_probs"):
            value = pad_token_id if name == "response_ids" else 0
            parts = [_repad(p, response_width, value, left=False) for p in parts]
        columns[name] = np.concatenate(parts)
    # Groups are contiguous; give them dense ids that are unique across runners.
    offsets, group_index = 0, []
    for b in batches:
        _, dense = np.unique(b.group_index, return_inverse=True)
        group_index.append(dense + offsets)
        offsets += int(dense.max()) + 1 if len(dense) else 0
    columns["group_index"] = np.concatenate(group_index).astype(np.int64)
    infos = [info for b in batches for info in b.infos]
    loss_mask = None
    if any(b.loss_mask is not None for b in batches):
        loss_mask = np.concatenate([
            _repad(b.response_mask if b.loss_mask is None else b.loss_mask, response_width, 0,
                   left=False) for b in batches])
    versions = None
    if any(b.token_versions is not None for b in batches):
        versions = np.concatenate([_repad(b.per_token_versions(), response_width, 0, left=False)
                                   for b in batches])
    vision = None
    if any(b.multi_modal_inputs is not None for b in batches):
        vision = vision_column([row for b in batches for row in (
            b.multi_modal_inputs if b.multi_modal_inputs is not None else [None] * len(b))])
    return RolloutBatch(**columns, infos=infos, loss_mask=loss_mask, token_versions=versions,
                        multi_modal_inputs=vision)


def data_metrics(batch: RolloutBatch, max_response_length: int) -> dict[str, float]:
    """verl's `compute_data_metrics` names for scores and lengths, plus group signal."""
    scores, lengths, prompt_lengths = batch.scores, batch.response_lengths, batch.prompt_lengths
    metrics: dict[str, float] = {}
    for name, values in (("critic/score", scores), ("response_length", lengths),
                         ("prompt_length", prompt_lengths)):
        if len(values):
            metrics[f"{name}/mean"] = float(np.mean(values))
            metrics[f"{name}/max"] = float(np.max(values))
            metrics[f"{name}/min"] = float(np.min(values))
    if len(lengths):
        metrics["response_length/clip_ratio"] = float(np.mean(lengths >= max_response_length))
        metrics["response/aborted_ratio"] = float(np.mean(lengths == 0))
    metrics.update(group_signal_metrics(batch))
    metrics.update(episode_metrics(batch.infos))
    metrics["reward/errors"] = float(np.sum(batch.reward_errors))
    accuracy = [float(info["acc"]) for info in batch.infos if info.get("acc") is not None]
    if accuracy:  # the reward function's ``acc``: right answers, whatever the shaping
        metrics["reward/acc/mean"] = float(np.mean(accuracy))
    return metrics


def group_signal_metrics(batch: RolloutBatch) -> dict[str, float]:
    """Fraction of groups whose scores are all equal (no signal), split by all-right/all-wrong.

    "Right" is the reward function's ``acc`` when it reports one, else ``score > 0``.
    """
    if not len(batch):
        return {}
    groups, scores = batch.group_index, batch.scores
    acc = np.asarray([
        bool(batch.infos[i].get("acc", scores[i] > 0)) if i < len(batch.infos) else scores[i] > 0
        for i in range(len(batch))
    ])
    flat = all_right = all_wrong = 0
    unique = np.unique(groups)
    for g in unique:
        in_group = groups == g
        s = scores[in_group]
        if len(s) > 1 and np.all(s == s[0]):
            flat += 1
            all_right += bool(acc[in_group].all())
            all_wrong += bool(not acc[in_group].any())
    n = len(unique)
    return {
        "groups/zero_variance_frac": flat / n,
        "groups/all_right_frac": all_right / n,
        "groups/all_wrong_frac": all_wrong / n,
    }
