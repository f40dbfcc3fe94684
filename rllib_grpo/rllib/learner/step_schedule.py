"""What the optimizer steps of one training step use, as verl's actor: the learning rate
(`LRSchedule`) and the order of the mini-batches (`minibatch_order`).

The LR factor comes from `rllib_grpo.algos.lr_schedule` and is evaluated at the number of
training steps (learner updates) done so far, so dynamic sampling, which samples several
generation batches per step, does not shorten the warm-up; all optimizer steps of one
training step share its learning rate, as in verl, whose scheduler steps once per
``update_actor``.  The step count is checkpointed with the learner.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch.utils.data import DataLoader

from rllib_grpo.algos.lr_schedule import lr_multiplier, needs_total_steps, num_warmup_steps


class LRSchedule:
    """The learning rate of each training step: ``base_lr x lr_multiplier(steps_done)``."""

    def __init__(self, base_lr: float, *, scheduler_type: str = "constant",
                 warmup_steps: int = 0, total_training_steps: int | None = None,
                 min_lr_ratio: float = 0.0, num_cycles: float = 0.5) -> None:
        self.base_lr = float(base_lr)
        self.kwargs: dict[str, Any] = dict(
            scheduler_type=scheduler_type, warmup_steps=warmup_steps,
            total_training_steps=total_training_steps, min_lr_ratio=min_lr_ratio,
            num_cycles=num_cycles)
        self.steps_done = 0

    @classmethod
    def from_config(cls, config: Any) -> LRSchedule | None:
        """The schedule a GRPO config asks for; None when ``lr`` is an RLlib schedule
        (a list of ``[timestep, lr]`` points, which RLlib applies itself)."""
        if isinstance(config.lr, list | tuple):
            return None
        total = config.total_training_steps
        return cls(config.lr, scheduler_type=config.lr_scheduler_type,
                   warmup_steps=num_warmup_steps(config.lr_warmup_steps,
                                                 config.lr_warmup_steps_ratio, total),
                   total_training_steps=total, min_lr_ratio=config.min_lr_ratio or 0.0,
                   num_cycles=config.num_cycles)

    def current_lr(self) -> float:
        """The learning rate of the training step about to run."""
        return self.base_lr * lr_multiplier(self.steps_done, **self.kwargs)

    def apply(self, optimizers: Iterable[torch.optim.Optimizer]) -> float:
        """Set every parameter group's ``lr`` for the coming training step; returns it."""
        lr = self.current_lr()
        for optimizer in optimizers:
            for group in optimizer.param_groups:
                group["lr"] = lr
        return lr

    def step(self) -> None:
        """One training step done (verl's ``lr_scheduler.step()`` after ``update_policy``)."""
        self.steps_done += 1

    def state_dict(self) -> dict[str, int]:
        return {"steps_done": self.steps_done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.steps_done = int(state["steps_done"])


def minibatch_order(num_rows: int, minibatch_size: int, num_epochs: int, shuffle: bool,
                    seed: int) -> tuple[list[int] | None, int]:
    """``(row order, passes)`` for RLlib's mini-batch iterator.

    Without ``shuffle``: ``(None, num_epochs)``, the rows in order every epoch.  With it
    (verl ``actor.shuffle``): every epoch, the first included, walks a new permutation,
    drawn exactly as verl's ``make_iterator`` does (a torch ``DataLoader`` with
    ``shuffle=True`` and a generator seeded with ``seed``, verl's ``data_loader_seed`` +
    the rank, once per training step); the epochs are laid end to end as one pass.
    RLlib's own ``shuffle_batch_per_epoch`` never shuffles the first epoch, nor any
    when there is one.
    """
    if not shuffle:
        return None, num_epochs
    generator = torch.Generator()
    generator.manual_seed(seed)
    rows: Any = torch.arange(num_rows)  # a tensor is a map-style dataset of its rows
    loader: DataLoader = DataLoader(rows, batch_size=minibatch_size, shuffle=True,
                                    generator=generator, collate_fn=list)
    return [int(row) for _ in range(num_epochs) for rows in loader for row in rows], 1


__all__ = ["LRSchedule", "minibatch_order", "needs_total_steps"]
