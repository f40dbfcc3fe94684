"""The one registry mechanism and the names each family registers."""

from __future__ import annotations

import pytest

from rllib_grpo.algos import (
    ADV_ESTIMATORS,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
)


def _f():
    return 1


def _g():
    return 2


def test_register_and_get():
    reg = Registry("thing")
    reg.register("f")(_f)
    assert reg.get("f") is _f
    assert reg["f"] is _f
    assert "f" in reg
    assert len(reg) == 1


def test_same_function_twice_is_allowed():
    reg = Registry("thing")
    reg.register("f")(_f)
    reg.register("f")(_f)
    reg.add("f", _f)
    assert reg.names() == ("f",)


def test_different_function_under_existing_name_raises():
    reg = Registry("thing")
    reg.register("f")(_f)
    with pytest.raises(ValueError, match="already registered"):
        reg.register("f")(_g)
    assert reg.get("f") is _f  # the original survives


def test_aliases_share_one_function():
    reg = Registry("thing")
    reg.register("kl", "k1")(_f)
    assert reg.get("kl") is reg.get("k1") is _f


def test_unknown_name_lists_known_names_sorted():
    reg = Registry("thing")
    for name in ("zeta", "alpha", "mid"):
        reg.add(name, _f)
    with pytest.raises(ValueError) as info:
        reg.get("nope")
    message = str(info.value)
    assert "Unknown thing 'nope'" in message
    assert "alpha, mid, zeta" in message


def test_lookup_is_case_sensitive():
    reg = Registry("thing")
    reg.add("grpo", _f)
    with pytest.raises(ValueError):
        reg.get("GRPO")
    assert "GRPO" not in reg


def test_bad_names_rejected():
    reg = Registry("thing")
    with pytest.raises(ValueError):
        reg.add("", _f)
    assert 3 not in reg  # non-strings are simply not there


def test_family_names():
    assert set(ADV_ESTIMATORS.names()) == {
        "grpo",
        "rloo",
        "grpo_passk",
        "opo",
        "reinforce_plus_plus",
        "reinforce_plus_plus_baseline",
        "remax",
        "gpg",
    }
    assert set(POLICY_LOSSES.names()) == {"vanilla", "gspo", "cispo", "gpg", "sapo"}
    assert set(KL_ESTIMATORS.names()) == {"kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"}
    assert set(KL_CONTROLLERS.names()) == {"fixed", "adaptive"}
    for family in (ADV_ESTIMATORS, POLICY_LOSSES, KL_ESTIMATORS, KL_CONTROLLERS):
        assert isinstance(family, Registry)


def test_families_reject_conflicting_registration():
    with pytest.raises(ValueError, match="already registered"):
        ADV_ESTIMATORS.register("grpo")(_f)
    with pytest.raises(ValueError, match="already registered"):
        POLICY_LOSSES.register("vanilla")(_f)
