"""KL estimators (values, clamps, straight-through gradients) and KL controllers."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_grpo.algos import (
    AdaptiveKLController,
    FixedKLController,
    get_kl_controller,
    kl_kinds,
    kl_penalty,
)

# delta = log_prob - ref_log_prob = [0, 1, -1, 1.5]
LOG_PROB = [0.0, 1.0, -1.0, 2.0]
REF_LOG_PROB = [0.0, 0.0, 0.0, 0.5]
E = math.e
EXPECTED = {
    "k1": [0.0, 1.0, -1.0, 1.5],
    "abs": [0.0, 1.0, 1.0, 1.5],
    "k2": [0.0, 0.5, 0.5, 1.125],  # delta² / 2
    # x = -delta = [0, -1, 1, -1.5]; exp(x) - x - 1:
    # [1 - 0 - 1, e^-1 + 1 - 1, e - 1 - 1, e^-1.5 + 1.5 - 1]
    "k3": [0.0, 1 / E, E - 2, math.exp(-1.5) + 0.5],
}
ALIASES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3"}


def _inputs(dtype=torch.float64):
    return torch.tensor(LOG_PROB, dtype=dtype), torch.tensor(REF_LOG_PROB, dtype=dtype)


@pytest.mark.parametrize("kind", ["k1", "abs", "k2", "k3", "kl", "mse", "low_var_kl"])
def test_values(kind):
    log_prob, ref = _inputs()
    expected = torch.tensor(EXPECTED[ALIASES.get(kind, kind)], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(log_prob, ref, kind), expected)


def test_k3_both_clamps():
    # delta = 30: x = clamp(-30) = -20 -> exp(-20) + 20 - 1 ≈ 19 -> clamped to 10
    # delta = -30: x = clamp(30) = 20 -> exp(20) - 21 -> clamped to 10
    # delta = -2: x = 2 -> e² - 3 ≈ 4.389 (inside both clamps)
    # delta = -3: x = 3 -> e³ - 4 ≈ 16.09 -> clamped to 10
    log_prob = torch.tensor([30.0, -30.0, -2.0, -3.0], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(log_prob, torch.zeros(4, dtype=torch.float64), "k3")
    torch.testing.assert_close(
        value.detach(), torch.tensor([10.0, 10.0, E**2 - 3, 10.0], dtype=torch.float64)
    )
    value.sum().backward()
    # clamped tokens carry no gradient; d/dlogp (e^{-δ} + δ - 1) = 1 - e^{-δ} at δ = -2
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([0.0, 0.0, 1 - E**2, 0.0], dtype=torch.float64)
    )


@pytest.mark.parametrize("base", ["k1", "kl", "abs", "k3", "low_var_kl", "k2", "mse"])
def test_straight_through_value_is_base_and_gradient_is_k2(base):
    log_prob, ref = _inputs()
    log_prob.requires_grad_(True)
    value = kl_penalty(log_prob, ref, base + "+")
    torch.testing.assert_close(value.detach(), kl_penalty(log_prob, ref, base).detach())
    value.sum().backward()
    # d/dlogp of k2 = delta
    torch.testing.assert_close(log_prob.grad, torch.tensor([0.0, 1.0, -1.0, 1.5]).double())


def test_k3_plus_gradient_survives_the_clamp():
    # plain k3 has zero gradient at delta = 30 (clamped); k3+ uses k2's gradient: 30
    log_prob = torch.tensor([30.0], dtype=torch.float64, requires_grad=True)
    value = kl_penalty(log_prob, torch.zeros(1, dtype=torch.float64), "k3+")
    assert value.item() == 10.0
    value.sum().backward()
    assert log_prob.grad.item() == 30.0


@settings(max_examples=50, deadline=None)
@given(
    deltas=st.lists(st.floats(-25, 25, allow_nan=False), min_size=1, max_size=8),
    base=st.sampled_from(["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"]),
)
def test_straight_through_property(deltas, base):
    ref = torch.linspace(-3.0, -1.0, len(deltas), dtype=torch.float64)
    log_prob = (ref + torch.tensor(deltas, dtype=torch.float64)).requires_grad_(True)
    value = kl_penalty(log_prob, ref, base + "+")
    torch.testing.assert_close(value.detach(), kl_penalty(log_prob, ref, base).detach())
    value.sum().backward()
    torch.testing.assert_close(log_prob.grad, (log_prob - ref).detach())


def test_k1_gradient_is_one():
    log_prob, ref = _inputs()
    log_prob.requires_grad_(True)
    kl_penalty(log_prob, ref, "k1").sum().backward()
    torch.testing.assert_close(log_prob.grad, torch.ones(4, dtype=torch.float64))


def test_full_is_not_implemented():
    log_prob, ref = _inputs()
    for kind in ("full", "full+"):
        with pytest.raises(NotImplementedError, match="full-vocabulary"):
            kl_penalty(log_prob, ref, kind)


def test_unknown_kind_lists_names():
    log_prob, ref = _inputs()
    with pytest.raises(ValueError, match="Known: abs, k1, k2, k3, kl, low_var_kl, mse"):
        kl_penalty(log_prob, ref, "k4")
    with pytest.raises(ValueError):
        kl_penalty(log_prob, ref, "K1")  # case-sensitive
    assert "k3+" in kl_kinds() and "low_var_kl" in kl_kinds()


# ------------------------------------------------------------------------ controllers


def test_fixed_controller():
    ctrl = FixedKLController(0.001)
    ctrl.update(current_kl=5.0, n_steps=1000)
    assert ctrl.value == 0.001
    assert ctrl.state_dict() == {"type": "fixed", "value": 0.001}


def test_adaptive_controller_hand_values():
    ctrl = AdaptiveKLController(init_kl_coef=0.2, target_kl=0.1, horizon=100)
    # kl 0.15: err = clip(1.5 - 1, -.2, .2) = 0.2; value *= 1 + 0.2·10/100 = 1.02 -> 0.204
    ctrl.update(0.15, n_steps=10)
    assert ctrl.value == pytest.approx(0.204)
    # kl 0.09: err = -0.1 -> value *= 1 - 0.1·10/100 = 0.99 -> 0.20196
    ctrl.update(0.09, n_steps=10)
    assert ctrl.value == pytest.approx(0.20196)
    # kl 0: err = clip(-1) = -0.2 -> value *= 0.98 -> 0.1979208
    ctrl.update(torch.tensor(0.0), n_steps=10)
    assert ctrl.value == pytest.approx(0.1979208)


def test_adaptive_controller_checks_and_checkpoint():
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, 0.1, horizon=0)
    ctrl = AdaptiveKLController(0.2, 0.1, 100)
    ctrl.update(1.0, 50)  # err 0.2 -> 0.2 · 1.1 = 0.22
    state = ctrl.state_dict()
    assert state == {
        "type": "adaptive",
        "value": pytest.approx(0.22),
        "target_kl": 0.1,
        "horizon": 100.0,
    }
    restored = AdaptiveKLController(0.2, 0.1, 100)
    restored.load_state_dict(state)
    assert restored.value == ctrl.value
    with pytest.raises(ValueError, match="cannot load"):
        FixedKLController(0.1).load_state_dict(state)


def test_get_kl_controller():
    fixed = get_kl_controller("fixed", kl_coef=0.05)
    assert isinstance(fixed, FixedKLController) and fixed.value == 0.05
    adaptive = get_kl_controller("adaptive", kl_coef=0.05, target_kl=0.2, horizon=500)
    assert isinstance(adaptive, AdaptiveKLController)
    assert (adaptive.value, adaptive.target, adaptive.horizon) == (0.05, 0.2, 500)
    with pytest.raises(ValueError, match="horizon"):
        get_kl_controller("adaptive", kl_coef=0.05, horizon=-1)
    with pytest.raises(ValueError, match="Known: adaptive, fixed"):
        get_kl_controller("pid", kl_coef=0.05)
