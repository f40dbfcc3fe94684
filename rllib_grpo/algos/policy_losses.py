"""Policy-gradient surrogate losses, registered under verl's ``policy_loss.loss_mode`` names.

Every loss has the signature::

    fn(old_log_prob, log_prob, advantages, response_mask, *, loss_agg_mode,
       config: PolicyLossConfig, agg_kwargs: dict, rollout_is_weights) -> (loss, metrics)

with ``(B, T)`` tensors (``log_prob`` carries the gradient), a 0-dim ``loss`` from
:func:`~rllib_grpo.algos.aggregation.agg_loss` (``agg_kwargs`` = ``dp_size``,
``global_num_tokens``, ``global_num_seqs``, ``horizon``), and ``metrics`` a dict of
**python floats** under verl's names (``actor/pg_clipfrac``, ``actor/ppo_kl``,
``actor/pg_clipfrac_lower``).  Floats, because metrics are logged, never differentiated;
they are read in one device sync per call.  Metrics are masked means over this
micro-batch (verl averages them over micro-batches).  ``rollout_is_weights`` ``(B, T)``
(off-policy correction) multiplies the per-token losses before aggregation.

Conventions shared with verl: ``ratio = exp(clamp(log_prob - old_log_prob, -20, 20))``
and ``actor/ppo_kl = masked_mean(old_log_prob - log_prob)`` (k1 of new vs old; can be
negative).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from rllib_grpo.algos.aggregation import agg_loss
from rllib_grpo.algos.functional import masked_mean, masked_sum
from rllib_grpo.algos.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
# Sequence-level losses ignore ``loss_agg_mode`` (verl): registered as their
# ``forced_agg_mode`` so that `explain` reads it from the registry.
SEQUENCE_LEVEL_AGG = "seq-mean-token-mean"


def forced_agg_mode(name: str) -> str | None:
    """The aggregation mode the policy loss ``name`` always uses, or None if it follows
    ``loss_agg_mode``."""
    return POLICY_LOSSES.meta(name).get("forced_agg_mode")

AGG_KWARGS = ("dp_size", "global_num_tokens", "global_num_seqs", "horizon")


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
    """Hyper-parameters of the policy losses (verl's ``actor.*`` / ``actor.policy_loss.*``).

    ``clip_ratio_low`` / ``clip_ratio_high`` are already resolved (they default to
    ``clip_ratio`` in :func:`policy_loss`).
    """

    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0  # dual clip for A < 0 (vanilla); must be > 1
    tau_pos: float = 1.0  # SAPO gate temperature for A > 0
    tau_neg: float = 1.05  # SAPO gate temperature for A <= 0


_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(PolicyLossConfig))


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    # clamp before exp: one stale token must not overflow the ratio
    return torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def _metrics(**values: torch.Tensor | float) -> dict[str, float]:
    """``{"actor/<name>": float}``, reading every tensor with a single device sync."""
    device = next((v.device for v in values.values() if isinstance(v, torch.Tensor)), None)
    stacked = torch.stack(
        [
            torch.as_tensor(v, device=device).detach().reshape(()).to(torch.float32)
            for v in values.values()
        ]
    )
    return {f"actor/{name}": value for name, value in zip(values, stacked.tolist(), strict=True)}


@POLICY_LOSSES.register("vanilla")
def vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    config: PolicyLossConfig,
    agg_kwargs: dict[str, Any],
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clip with asymmetric range and dual clip (Ye et al. 2019) for ``A < 0``.

    ``L1 = -A·ratio``, ``L2 = -A·clamp(ratio, 1-eps_low, 1+eps_high)``, ``Lc = max(L1, L2)``;
    where ``A < 0``: ``L = min(-A·clip_ratio_c, Lc)``, else ``L = Lc``.
    Metrics: ``pg_clipfrac = mean(L2 > L1)``, ``pg_clipfrac_lower = mean((Lc > L3)·(A<0))``.
    """
    if not config.clip_ratio_c > 1.0:
        raise ValueError(
            f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {config.clip_ratio_c}"
        )
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(
        ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high
    )
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * config.clip_ratio_c
    clip_pg_losses2 = torch.minimum(pg_losses3, clip_pg_losses1)
    negative = advantages < 0
    pg_losses = torch.where(negative, clip_pg_losses2, clip_pg_losses1)
    loss = agg_loss(
        _weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, **agg_kwargs
    )
    return loss, _metrics(
        pg_clipfrac=masked_mean((pg_losses2 > pg_losses1).float(), response_mask),
        ppo_kl=masked_mean(-log_ratio, response_mask),
        pg_clipfrac_lower=masked_mean(
            ((clip_pg_losses1 > pg_losses3) & negative).float(), response_mask
        ),
    )


@POLICY_LOSSES.register("gspo", forced_agg_mode=SEQUENCE_LEVEL_AGG)
def gspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    config: PolicyLossConfig,
    agg_kwargs: dict[str, Any],
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (Zheng et al. 2025): a clipped *sequence* importance ratio.

    ``log s_i = Σ_t m·(logp - old) / |o_i|``; per token
    ``log s_it = logp - sg(logp) + sg(log s_i)`` (value ``log s_i``, gradient of ``logp``),
    clamped to ``max=10``; ``L = max(-A·s_it, -A·clamp(s_it, 1-eps_low, 1+eps_high))``,
    no dual clip.  Always aggregated with ``seq-mean-token-mean`` (``loss_agg_mode`` is
    ignored); ``pg_clipfrac_lower`` is 0.
    """
    log_ratio = log_prob - old_log_prob  # no ±20 clamp here (verl)
    seq_lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = masked_sum(log_ratio, response_mask, dim=-1) / seq_lengths
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    pg_losses1 = -advantages * seq_ratio
    pg_losses2 = -advantages * torch.clamp(
        seq_ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high
    )
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    loss = agg_loss(
        _weighted(pg_losses, rollout_is_weights), response_mask, SEQUENCE_LEVEL_AGG, **agg_kwargs
    )
    return loss, _metrics(
        pg_clipfrac=masked_mean((pg_losses2 > pg_losses1).float(), response_mask),
        ppo_kl=masked_mean(-log_ratio, response_mask),
        pg_clipfrac_lower=0.0,
    )


@POLICY_LOSSES.register("cispo")
def cispo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    config: PolicyLossConfig,
    agg_kwargs: dict[str, Any],
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1): ``L = -sg(clamp(ratio, 1-eps_low, 1+eps_high))·A·logp``.

    The clipped ratio only weights the REINFORCE term, so clipped tokens keep a gradient.
    ``pg_clipfrac = mean(ratio outside the range)``; ``pg_clipfrac_lower`` is 0.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    clipped_ratio = torch.clamp(ratio, 1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    loss = agg_loss(
        _weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, **agg_kwargs
    )
    return loss, _metrics(
        pg_clipfrac=masked_mean((ratio != clipped_ratio).float(), response_mask),
        ppo_kl=masked_mean(-log_ratio, response_mask),
        pg_clipfrac_lower=0.0,
    )


@POLICY_LOSSES.register("gpg")
def gpg_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    config: PolicyLossConfig,
    agg_kwargs: dict[str, Any],
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GPG: plain REINFORCE ``L = -logp·A`` (no ratio, no clip); no metrics (as verl)."""
    pg_losses = -log_prob * advantages
    loss = agg_loss(
        _weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, **agg_kwargs
    )
    return loss, {}


@POLICY_LOSSES.register("sapo", forced_agg_mode=SEQUENCE_LEVEL_AGG)
def sapo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    config: PolicyLossConfig,
    agg_kwargs: dict[str, Any],
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SAPO: a smooth sigmoid gate instead of a hard clip.

    ``L = -gate(ratio)·A`` with ``gate(x) = sigmoid(tau·(x - 1))·4/tau``,
    ``tau = tau_pos`` where ``A > 0`` else ``tau_neg``.  Always aggregated with
    ``seq-mean-token-mean``; both clip fractions are 0.
    """
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    taus = torch.where(
        advantages > 0,
        torch.as_tensor(config.tau_pos, dtype=ratio.dtype, device=ratio.device),
        torch.as_tensor(config.tau_neg, dtype=ratio.dtype, device=ratio.device),
    )
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = -gates * advantages
    loss = agg_loss(
        _weighted(pg_losses, rollout_is_weights), response_mask, SEQUENCE_LEVEL_AGG, **agg_kwargs
    )
    return loss, _metrics(
        pg_clipfrac=0.0,
        ppo_kl=masked_mean(-log_ratio, response_mask),
        pg_clipfrac_lower=0.0,
    )


def policy_loss(
    name: str,
    *,
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    rollout_is_weights: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Compute the policy loss registered as ``name`` on one micro-batch.

    Args:
        name: a key of :data:`POLICY_LOSSES` (``vanilla``, ``gspo``, ``cispo``, ``gpg``,
            ``sapo``).
        old_log_prob: ``(B, T)`` log-probs of the policy that sampled (no gradient).
        log_prob: ``(B, T)`` log-probs of the current policy (with gradient).
        advantages: ``(B, T)``.
        response_mask: ``(B, T)``.
        loss_agg_mode: one of :data:`~rllib_grpo.algos.aggregation.AGG_MODES`
            (``gspo``/``sapo`` always use ``seq-mean-token-mean``).
        clip_ratio: default for ``clip_ratio_low`` and ``clip_ratio_high``.
        clip_ratio_c: dual-clip bound of ``vanilla`` (> 1).
        rollout_is_weights: ``(B, T)`` importance weights multiplying per-token losses.
        **kwargs: ``agg_loss`` options (``dp_size``, ``global_num_tokens``,
            ``global_num_seqs``, ``horizon``) and loss options (``tau_pos``, ``tau_neg``);
            anything else is a ``TypeError``.

    Returns:
        ``(loss, metrics)``: a 0-dim tensor and a dict of python floats.
    """
    fn = POLICY_LOSSES.get(name)
    agg_kwargs = {k: kwargs.pop(k) for k in AGG_KWARGS if k in kwargs}
    unknown = sorted(set(kwargs) - set(_CONFIG_FIELDS))
    if unknown:
        raise TypeError(
            f"policy_loss() got unexpected keyword arguments {unknown}; accepted extras: "
            f"{sorted(AGG_KWARGS + _CONFIG_FIELDS)}"
        )
    config = PolicyLossConfig(
        clip_ratio_low=clip_ratio if clip_ratio_low is None else clip_ratio_low,
        clip_ratio_high=clip_ratio if clip_ratio_high is None else clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        **kwargs,
    )
    return fn(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode=loss_agg_mode,
        config=config,
        agg_kwargs=agg_kwargs,
        rollout_is_weights=rollout_is_weights,
    )
