"""Memory levers that move tensors between the device and host memory.

* `HostOffloaded`: a frozen model (the reference) kept in pinned host memory and moved
  to the learner's device once per pass (``ref_param_offload``; a no-op on CPU);
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

    The host copy is pinned where CUDA is available (``pin_memory`` needs it), so the
    copies in are asynchronous (``non_blocking``) DMA; the way back copies nothing (the
    model is frozen: its parameters point at the host copy again and the device copy is
    freed).  Nested `on` blocks move nothing: the learner holds the reference on the device
    for a whole pass (`on` around all micro-batches), the module's forward asks again per
    micro-batch.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model.to("cpu")
        # parameters() and buffers() yield tied tensors once: they stay tied.
        self._tensors = [*self.model.parameters(), *self.model.buffers()]
        self._host = [_pinned(t.data) for t in self._tensors]
        self._point_at(self._host)
        self._depth = 0  # nesting of `on` blocks: only the outermost moves

    @contextlib.contextmanager
    def on(self, device: torch.device | str) -> Iterator[torch.nn.Module]:
        """The model on ``device`` for the ``with`` block (inside another `on`: as it is)."""
        device = torch.device(device)
        moves = self._depth == 0 and not self._stays(device)
        if moves:
            self._load(device)
        self._depth += 1
        try:
            yield self.model
        finally:
            self._depth -= 1
            if moves:
                self._unload()

    @staticmethod
    def _stays(device: torch.device) -> bool:
        """Whether ``device`` is host memory (nothing to move)."""
        return device.type == "cpu"

    def _load(self, device: torch.device) -> None:
        self._point_at([h.to(device, non_blocking=True) for h in self._host])

    def _unload(self) -> None:
        self._point_at(self._host)

    def _point_at(self, data: list[torch.Tensor]) -> None:
        for tensor, value in zip(self._tensors, data, strict=True):
            tensor.data = value


def _pinned(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in page-locked memory where CUDA is available (else as it is)."""
    return tensor.pin_memory() if torch.cuda.is_available() else tensor


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
