"""Per-token KL estimators between the current policy and the reference policy.

``delta = log_prob - ref_log_prob`` (current minus reference), all shapes ``(B, T)``
(any shape works: the estimators are elementwise).  See Schulman, "Approximating KL
divergence" (http://joschu.net/blog/kl-approx.html).

=====================  =====================================================
name(s)                value
=====================  =====================================================
``kl``, ``k1``         ``delta``
``abs``                ``|delta|``
``mse``, ``k2``        ``0.5 · delta²``
``low_var_kl``, ``k3`` ``clamp(exp(x) - x - 1, -10, 10)``, ``x = clamp(-delta, -20, 20)``
``full``               ``NotImplementedError`` (needs full-vocabulary distributions)
=====================  =====================================================

A trailing ``+`` (``k1+``, ``k3+``, ``low_var_kl+``, ``abs+``, ...) selects the
straight-through variant: the *value* of the base estimator with the *gradient* of k2
(``delta``), whose expected gradient is the true KL gradient.  verl [JAN] forgot to strip
the ``+`` before dispatch and raised for every such name; here it works.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from rllib_grpo.algos.registry import Registry

KLFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

KL_ESTIMATORS: Registry[KLFn] = Registry("KL estimator")


@KL_ESTIMATORS.register("kl", "k1")
def kl_k1(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k1: ``log_prob - ref_log_prob`` (unbiased, high variance, can be negative)."""
    return log_prob - ref_log_prob


@KL_ESTIMATORS.register("abs")
def kl_abs(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """``|log_prob - ref_log_prob|``."""
    return (log_prob - ref_log_prob).abs()


@KL_ESTIMATORS.register("mse", "k2")
def kl_k2(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k2: ``0.5 · (log_prob - ref_log_prob)²``; its gradient is ``delta``."""
    return 0.5 * (log_prob - ref_log_prob).square()


@KL_ESTIMATORS.register("low_var_kl", "k3")
def kl_k3(log_prob: torch.Tensor, ref_log_prob: torch.Tensor) -> torch.Tensor:
    """k3: ``exp(x) - x - 1`` with ``x = ref_log_prob - log_prob``; non-negative.

    Both of verl's clamps: ``x`` to ``[-20, 20]`` before ``exp`` and the result to
    ``[-10, 10]`` (which also stops the gradient on clamped tokens).
    """
    x = torch.clamp(ref_log_prob - log_prob, min=-20.0, max=20.0)
    return torch.clamp(torch.exp(x) - x - 1, min=-10.0, max=10.0)


def kl_kinds() -> tuple[str, ...]:
    """Every accepted ``kind``: registered names and their ``+`` variants, sorted."""
    names = KL_ESTIMATORS.names()
    return tuple(sorted(names + tuple(f"{name}+" for name in names)))


def kl_penalty(log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (see the module docstring); same shape as inputs.

    Raises:
        NotImplementedError: for ``full`` / ``full+``.
        ValueError: for an unknown ``kind`` (the message lists the known ones).
    """
    straight_through = isinstance(kind, str) and kind.endswith("+")
    base = kind[:-1] if straight_through else kind
    if base == "full":
        raise NotImplementedError(
            "kl_penalty 'full' needs the full-vocabulary distributions of both policies, which "
            "this per-token interface does not have; use 'low_var_kl' (k3) or 'kl' (k1)"
        )
    if base not in KL_ESTIMATORS:
        raise ValueError(
            f"Unknown KL estimator {kind!r}. Known: {', '.join(KL_ESTIMATORS.names())} "
            "(each also with a '+' suffix for the straight-through k2 gradient)"
        )
    value = KL_ESTIMATORS.get(base)(log_prob, ref_log_prob)
    if not straight_through or base in ("mse", "k2"):
        return value
    # value of the base estimator, gradient of k2 (delta)
    k2 = kl_k2(log_prob, ref_log_prob)
    return k2 - k2.detach() + value.detach()
