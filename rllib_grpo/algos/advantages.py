"""Outcome advantage estimators, registered under verl's names.

Every estimator is a pure function run under ``torch.no_grad()`` with the keyword
interface::

    fn(token_level_rewards, response_mask, group_ids=None, *, epsilon=1e-6,
       norm_adv_by_std_in_grpo=True, gamma=1.0, reward_baselines=None, **kwargs)
        -> (advantages, returns)           # both (B, T), zero where response_mask is 0

and ignores the options it does not use.  ``r_i = token_level_rewards[i].sum()`` is
the outcome of response ``i`` (so a KL-in-reward penalty is summed into it), and
``group_ids`` (any ``B`` hashables: uuid strings, ints, a numpy array) says which
responses answer the same prompt.  Singleton groups follow verl: mean 0, std 1.

Estimators registered with ``batch_wide=True`` use statistics of the whole batch; when the
batch is split over learners (each holding whole groups) they take ``reduce_sum``, a sum
over the learners, so the result equals the unsplit batch's.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from typing import Any

import torch

from rllib_grpo.algos.functional import (
    ReduceSum,
    group_index,
    group_stats,
    masked_whiten,
    safe_div,
)
from rllib_grpo.algos.registry import Registry

AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]
GroupIds = Iterable[Hashable] | torch.Tensor

ADV_ESTIMATORS: Registry[AdvantageFn] = Registry("advantage estimator")


def is_batch_wide(estimator: str) -> bool:
    """Whether ``estimator`` uses statistics of the whole batch (not only of each group)."""
    return bool(ADV_ESTIMATORS.meta(estimator).get("batch_wide"))


def needs_groups(estimator: str) -> bool:
    """Whether ``estimator``'s baseline is the group (a group of one has no relative signal)."""
    return bool(ADV_ESTIMATORS.meta(estimator).get("needs_groups"))


def _groups(estimator: str, group_ids: GroupIds | None, scores: torch.Tensor):
    if group_ids is None:
        raise ValueError(
            f"advantage estimator {estimator!r} compares responses within a prompt group and "
            "needs group_ids (one hashable per response, e.g. the prompt uid)"
        )
    return group_index(group_ids, scores.shape[0], scores.device)


def _broadcast(scalars: torch.Tensor, response_mask: torch.Tensor, dtype: torch.dtype):
    """``(B,)`` per-response scalars -> ``(B, T)``, zero on padding."""
    return scalars.to(dtype).unsqueeze(-1) * response_mask.to(dtype)


@ADV_ESTIMATORS.register("grpo", needs_groups=True)
@torch.no_grad()
def grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO: ``A_i = (r_i - mean_g) / (std_g + epsilon)`` broadcast over tokens.

    ``std_g`` is unbiased; ``epsilon`` is added to the std, not the variance.  With
    ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO) ``A_i = r_i - mean_g``.  A group of
    equal rewards gets exactly 0; a singleton gets ``r_i / (1 + epsilon)``.

    Shapes: rewards/mask ``(B, T)`` -> ``(B, T)``, ``(B, T)`` (the same tensor twice).
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("grpo", group_ids, scores)
    mean, std, _count = group_stats(scores, index, num_groups)
    centered = scores.to(mean.dtype) - mean[index]
    if norm_adv_by_std_in_grpo:
        centered = centered / (std[index] + epsilon)
    advantages = _broadcast(centered, response_mask, token_level_rewards.dtype)
    return advantages, advantages


@ADV_ESTIMATORS.register("rloo", needs_groups=True)
@torch.no_grad()
def rloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: ``A_i = n/(n-1) · (r_i - mean_g) = r_i - mean_{j≠i} r_j`` for ``n > 1``.

    A singleton keeps ``A_i = r_i`` (verl's loop version; ``rloo_vectorized`` gives 0).

    Shapes: ``(B, T)`` -> ``(B, T)``, ``(B, T)``.
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("rloo", group_ids, scores)
    mean, _std, count = group_stats(scores, index, num_groups)
    n = count[index].to(mean.dtype)
    scale = torch.where(n > 1, n / (n - 1).clamp(min=1), torch.ones_like(n))
    advantages = _broadcast(
        scale * (scores.to(mean.dtype) - mean[index]), response_mask, token_level_rewards.dtype
    )
    return advantages, advantages


@ADV_ESTIMATORS.register("grpo_passk", needs_groups=True)
@torch.no_grad()
def grpo_passk_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO pass@k: only each group's best response gets ``r_max - r_2nd``.

    Optionally divided by ``std_g + epsilon`` (unbiased).  Every other response gets 0;
    on a tie for the maximum the advantage is 0 (the first of the tied responses is the
    one "chosen").  Every group needs at least 2 responses, else ``ValueError``.

    Shapes: ``(B, T)`` -> ``(B, T)``, ``(B, T)``.
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("grpo_passk", group_ids, scores)
    mean, std, count = group_stats(scores, index, num_groups)
    if bool((count < 2).any()):
        raise ValueError(
            "Pass@k requires at least 2 samples per group; got group sizes "
            f"{sorted(set(count.tolist()))}"
        )
    x = scores.to(mean.dtype)
    neg_inf = torch.full((num_groups,), float("-inf"), dtype=x.dtype, device=x.device)
    r_max = neg_inf.scatter_reduce(0, index, x, reduce="amax")
    positions = torch.arange(x.shape[0], device=x.device)
    is_max = x == r_max[index]
    # the first arg-max of each group: smallest position among the maxima
    candidate = torch.where(is_max, positions, torch.full_like(positions, x.shape[0]))
    first_max = torch.full((num_groups,), x.shape[0], dtype=torch.long, device=x.device)
    first_max = first_max.scatter_reduce(0, index, candidate, reduce="amin")
    chosen = positions == first_max[index]
    r_second = neg_inf.scatter_reduce(
        0, index, torch.where(chosen, torch.full_like(x, float("-inf")), x), reduce="amax"
    )
    gap = r_max - r_second
    if norm_adv_by_std_in_grpo:
        gap = gap / (std + epsilon)
    scalars = torch.where(chosen, gap[index], torch.zeros_like(x))
    advantages = _broadcast(scalars, response_mask, token_level_rewards.dtype)
    return advantages, advantages


@ADV_ESTIMATORS.register("opo", needs_groups=True)
@torch.no_grad()
def opo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO: length-weighted baseline ``b_g = Σ_j |o_j| r_j / Σ_j |o_j|``; ``A_i = r_i - b_g``.

    ``|o_j|`` is the number of response tokens.  A singleton has ``b = 0``.  A group
    whose responses are all empty falls back to the plain group mean (verl divides 0 by
    0; the advantages are zero either way because the mask is).

    Shapes: ``(B, T)`` -> ``(B, T)``, ``(B, T)``.
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("opo", group_ids, scores)
    mean, _std, count = group_stats(scores, index, num_groups)
    x = scores.to(mean.dtype)
    lengths = response_mask.sum(dim=-1).to(x.dtype)
    # weighted mean taken around the plain group mean, so equal rewards give exactly 0
    reference = torch.where(count > 1, mean, torch.zeros_like(mean))[index]
    weighted = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(
        0, index, lengths * (x - reference)
    )
    total_len = torch.zeros(num_groups, dtype=x.dtype, device=x.device).index_add_(
        0, index, lengths
    )
    baseline = reference + safe_div(weighted, total_len)[index]  # empty group: plain mean
    baseline = torch.where(count[index] > 1, baseline, torch.zeros_like(baseline))
    advantages = _broadcast(x - baseline, response_mask, token_level_rewards.dtype)
    return advantages, advantages


@ADV_ESTIMATORS.register("reinforce_plus_plus", needs_groups=False, batch_wide=True)
@torch.no_grad()
def reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    gamma: float = 1.0,
    reduce_sum: ReduceSum | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted reward-to-go, whitened over the whole batch.

    Mask-aware (verl [NEW]): ``G_t = r_t + gamma·G_{t+1}`` on response tokens; tokens with
    ``m_t = 0`` (padding, multi-turn observations) carry the running return through
    unchanged and contribute no reward.  ``returns = G·m``;
    ``advantages = masked_whiten(G, m)·m`` (batch-global, unbiased variance, so at least
    two response tokens are needed in the batch).  ``group_ids`` is unused.

    Shapes: ``(B, T)`` -> advantages ``(B, T)``, returns ``(B, T)``.
    """
    mask = response_mask.to(token_level_rewards.dtype)
    returns = torch.zeros_like(token_level_rewards)
    running = torch.zeros_like(token_level_rewards[:, 0])
    for t in reversed(range(token_level_rewards.shape[-1])):
        m_t = mask[:, t]
        running = m_t * (token_level_rewards[:, t] + gamma * running) + (1 - m_t) * running
        returns[:, t] = running * m_t
    advantages = masked_whiten(returns, mask, reduce_sum=reduce_sum) * mask
    return advantages, returns


@ADV_ESTIMATORS.register("reinforce_plus_plus_baseline", needs_groups=True, batch_wide=True)
@torch.no_grad()
def reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    reduce_sum: ReduceSum | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: ``r_i - mean_g`` on every token, then batch ``masked_whiten``.

    No per-group std; the whitening is over all response tokens of the batch.

    Shapes: ``(B, T)`` -> ``(B, T)``, ``(B, T)``.
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("reinforce_plus_plus_baseline", group_ids, scores)
    mean, _std, _count = group_stats(scores, index, num_groups)
    mask = response_mask.to(token_level_rewards.dtype)
    centered = _broadcast(scores.to(mean.dtype) - mean[index], mask, token_level_rewards.dtype)
    advantages = masked_whiten(centered, mask, reduce_sum=reduce_sum) * mask
    return advantages, advantages


@ADV_ESTIMATORS.register("remax", needs_groups=False)
@torch.no_grad()
def remax_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    reward_baselines: torch.Tensor | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax: ``returns = reverse-cumsum(r·m)``; ``A = returns - b·m``.

    ``reward_baselines`` ``(B,)`` is the reward of the greedy response to the same
    prompt.  Returns are zeroed where ``m = 0`` (verl leaves the reward-to-go there).

    Shapes: ``(B, T)`` and ``(B,)`` -> ``(B, T)``, ``(B, T)``.
    """
    if reward_baselines is None:
        raise ValueError(
            "advantage estimator 'remax' needs reward_baselines: a (B,) tensor with the reward "
            "of the greedy (do_sample=False) response to each prompt"
        )
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    baselines = torch.as_tensor(reward_baselines, dtype=returns.dtype, device=returns.device)
    advantages = (returns - baselines.reshape(-1, 1)) * mask
    return advantages, returns * mask


@ADV_ESTIMATORS.register("gpg", needs_groups=True, batch_wide=True)
@torch.no_grad()
def gpg_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    f_norm: float = 1.0,
    reduce_sum: ReduceSum | None = None,
    **_: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GPG: ``A_i = alpha · (r_i - mean_g) / f_norm`` with ``alpha = B / max(#{r_i ≠ 0}, 1)``.

    ``alpha`` is computed over the whole batch (verl overwrites any ``alpha`` argument).
    No std normalisation.  Pair with the ``gpg`` policy loss.

    Shapes: ``(B, T)`` -> ``(B, T)``, ``(B, T)``.
    """
    scores = token_level_rewards.sum(dim=-1)
    index, num_groups = _groups("gpg", group_ids, scores)
    mean, _std, _count = group_stats(scores, index, num_groups)
    counts = torch.tensor([float(scores.shape[0]), float(torch.count_nonzero(scores))],
                          dtype=torch.float64, device=scores.device)
    if reduce_sum is not None:  # the whole batch's size and non-zero count
        counts = reduce_sum(counts)
    alpha = float(counts[0]) / max(float(counts[1]), 1.0)
    scalars = alpha * (scores.to(mean.dtype) - mean[index]) / f_norm
    advantages = _broadcast(scalars, response_mask, token_level_rewards.dtype)
    return advantages, advantages


def compute_advantage(
    estimator: str,
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    group_ids: GroupIds | None = None,
    *,
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
    gamma: float = 1.0,
    reward_baselines: torch.Tensor | None = None,
    reduce_sum: ReduceSum | None = None,
    **estimator_kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the advantage estimator registered as ``estimator``.

    Args:
        estimator: a name in :data:`ADV_ESTIMATORS` (verl's ``algorithm.adv_estimator``).
        token_level_rewards: ``(B, T)`` rewards (scores, minus a KL penalty if in-reward).
        response_mask: ``(B, T)``, 1 on response tokens.
        group_ids: ``B`` hashables naming each response's prompt group.
        norm_adv_by_std_in_grpo: divide by the group std (``False`` = Dr.GRPO).
        epsilon: added to the std.
        gamma: discount (``reinforce_plus_plus``).
        reward_baselines: ``(B,)`` greedy rewards (``remax``).
        reduce_sum: sums a tensor over the learners when the batch is split over them
            (batch-wide estimators, see :func:`is_batch_wide`); None = this is the batch.
        **estimator_kwargs: other estimator-specific options (e.g. ``f_norm`` for ``gpg``).

    Returns:
        ``(advantages, returns)``, both ``(B, T)`` and zero where ``response_mask`` is 0.
    """
    fn = ADV_ESTIMATORS.get(estimator)
    if token_level_rewards.ndim != 2 or token_level_rewards.shape != response_mask.shape:
        raise ValueError(
            "token_level_rewards and response_mask must both be (B, T); got "
            f"{tuple(token_level_rewards.shape)} and {tuple(response_mask.shape)}"
        )
    return fn(
        token_level_rewards,
        response_mask,
        group_ids,
        norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        epsilon=epsilon,
        gamma=gamma,
        reward_baselines=reward_baselines,
        reduce_sum=reduce_sum,
        **estimator_kwargs,
    )
