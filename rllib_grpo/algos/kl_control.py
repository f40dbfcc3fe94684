"""KL coefficient controllers for the in-reward KL penalty (verl's ``algorithm.kl_ctrl``).

``apply_kl_penalty`` uses ``controller.value`` as beta for this step, then calls
``controller.update(current_kl, n_steps=number_of_trajectories)``.  Controllers are
plain Python objects; ``state_dict()`` / ``load_state_dict()`` carry the coefficient
through checkpoints (the adaptive one drifts, so losing it on restore would change
the run).
"""

from __future__ import annotations

from typing import Any

from rllib_grpo.algos.registry import Registry

KL_CONTROLLERS: Registry[type] = Registry("KL controller type")


@KL_CONTROLLERS.register("fixed")
class FixedKLController:
    """A constant coefficient: ``value = kl_coef``; ``update`` does nothing."""

    kind = "fixed"

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for a uniform interface)."""

    def state_dict(self) -> dict[str, Any]:
        """``{"type": "fixed", "value": ...}``."""
        return {"type": self.kind, "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore ``value``; the type must match."""
        _check_type(self.kind, state)
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(value={self.value})"


@KL_CONTROLLERS.register("adaptive")
class AdaptiveKLController:
    """Ziegler et al. (2019) proportional controller.

    ``err = clip(current_kl / target_kl - 1, -0.2, 0.2)``;
    ``value *= 1 + err · n_steps / horizon``.
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if not horizon > 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        if not target_kl > 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move ``value`` toward the target KL; ``n_steps`` = trajectories in the batch."""
        proportional_error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + proportional_error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        """Type, current value, target and horizon."""
        return {
            "type": self.kind,
            "value": self.value,
            "target_kl": self.target,
            "horizon": self.horizon,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the coefficient (target and horizon stay as configured)."""
        _check_type(self.kind, state)
        self.value = float(state["value"])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(value={self.value}, target_kl={self.target}, "
            f"horizon={self.horizon})"
        )


KLController = FixedKLController | AdaptiveKLController


def _check_type(kind: str, state: dict[str, Any]) -> None:
    saved = state.get("type", kind)
    if saved != kind:
        raise ValueError(f"cannot load a {saved!r} KL controller state into a {kind!r} one")


def get_kl_controller(
    type: str = "fixed",  # verl's config key is ``kl_ctrl.type``
    kl_coef: float = 0.001,
    target_kl: float = 0.1,
    horizon: float = 10000,
) -> KLController:
    """Build the controller for verl's ``algorithm.kl_ctrl`` (defaults are verl's).

    Unknown types raise ``ValueError`` listing the known ones (verl raises
    ``NotImplementedError``); ``adaptive`` needs ``horizon > 0``.
    """
    cls = KL_CONTROLLERS.get(type)
    if cls is AdaptiveKLController:
        return AdaptiveKLController(init_kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    return cls(kl_coef)
