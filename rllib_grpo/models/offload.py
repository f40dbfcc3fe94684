"""Memory levers that move tensors between the device and host memory.

* `HostOffloaded`: a frozen model (the reference) kept in host memory and moved
  to the learner's device for each use (``ref_param_offload``; a no-op on CPU);
* `offload_optimizer_states`: AdamW states in host memory between optimizer
  steps (``optimizer_offload``; hooks that `GRPOLearner` installs; a no-op on CPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch


class HostOffloaded:
    """A frozen model kept in host memory, moved to a device for each use.

    Not an ``nn.Module`` attribute of its owner on purpose: ``module.to(device)``
    leaves it where it is.  On a CPU device nothing moves.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.to("cpu")

    @contextlib.contextmanager
    def on(self, device: torch.device | str) -> Iterator[torch.nn.Module]:
        device = torch.device(device)
        if device.type == "cpu":
            yield self.model
            return
        self.model.to(device)
        try:
            yield self.model
        finally:
            self.model.to("cpu")


def offload_optimizer_states(optimizer: torch.optim.Optimizer) -> list[Any]:
    """Keep ``optimizer``'s states in host memory except during ``step()``.

    Registers step pre/post hooks (verl's ``optimizer_offload``: states are loaded
    before the update and offloaded after it).  Returns the hook handles.
    """
    def to_params(opt: torch.optim.Optimizer, *_: Any) -> None:
        move_optimizer_states(opt, None)

    def to_host(opt: torch.optim.Optimizer, *_: Any) -> None:
        move_optimizer_states(opt, torch.device("cpu"))

    return [optimizer.register_step_pre_hook(to_params),
            optimizer.register_step_post_hook(to_host)]


def move_optimizer_states(optimizer: torch.optim.Optimizer, device: torch.device | None) -> None:
    """Move every state tensor (not Adam's ``step`` counter) to ``device`` (None: its param's)."""
    for param, state in optimizer.state.items():
        target = device or param.device
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.device != target:
                state[key] = value.to(target, non_blocking=True)
