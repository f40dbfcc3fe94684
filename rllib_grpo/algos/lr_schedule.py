"""verl's actor learning-rate schedules as pure functions of the scheduler step.

verl builds a ``LambdaLR`` with ``get_constant_schedule_with_warmup`` or
``get_cosine_schedule_with_warmup`` (``verl/utils/torch_functional.py``) and steps it
once per ``update_actor`` call, i.e. once per training step: every optimizer step of a
training step uses the same learning rate, and the first step runs at ``lr x
lr_multiplier(0)`` (0 while warming up).  No torch, no Ray.
"""

from __future__ import annotations

import math

LR_SCHEDULER_TYPES = ("constant", "cosine")


def num_warmup_steps(lr_warmup_steps: int, lr_warmup_steps_ratio: float,
                     total_training_steps: int | None) -> int:
    """verl's warm-up length: ``lr_warmup_steps``, or when it is negative
    ``int(lr_warmup_steps_ratio x total_training_steps)``.

    Raises ValueError when the ratio is needed (and non-zero) but the total is unknown.
    """
    if lr_warmup_steps >= 0:
        return int(lr_warmup_steps)
    if not lr_warmup_steps_ratio:
        return 0
    if total_training_steps is None:
        raise ValueError("lr_warmup_steps_ratio needs total_training_steps")
    return int(lr_warmup_steps_ratio * total_training_steps)


def needs_total_steps(lr_scheduler_type: str, lr_warmup_steps: int,
                      lr_warmup_steps_ratio: float) -> bool:
    """Whether the schedule depends on the run's length (cosine decay, a warm-up ratio)."""
    return lr_scheduler_type == "cosine" or (lr_warmup_steps < 0 and bool(lr_warmup_steps_ratio))


def lr_multiplier(step: int, *, scheduler_type: str = "constant", warmup_steps: int = 0,
                  total_training_steps: int | None = None, min_lr_ratio: float = 0.0,
                  num_cycles: float = 0.5) -> float:
    """The factor on the base learning rate at scheduler step ``step`` (0-based).

    ``constant``: linear warm-up from 0 over ``warmup_steps``, then 1.
    ``cosine``: the same warm-up, then ``max(min_lr_ratio, c·cos(2π·num_cycles·p) + i)``
    with ``p`` the fraction of the post-warm-up steps done, ``c = (1 - min_lr_ratio)/2``
    and ``i = (1 + min_lr_ratio)/2`` (decays from 1 to ``min_lr_ratio`` over the run).
    """
    if scheduler_type not in LR_SCHEDULER_TYPES:
        raise ValueError(f"lr_scheduler_type={scheduler_type!r}: use one of {LR_SCHEDULER_TYPES}")
    if step < warmup_steps:
        return float(step) / float(max(1, warmup_steps))
    if scheduler_type == "constant":
        return 1.0
    if total_training_steps is None:
        raise ValueError("the cosine schedule needs total_training_steps")
    progress = float(step - warmup_steps) / float(max(1, total_training_steps - warmup_steps))
    coef, intercept = (1.0 - min_lr_ratio) * 0.5, (1.0 + min_lr_ratio) * 0.5
    return max(min_lr_ratio, math.cos(math.pi * float(num_cycles) * 2.0 * progress) * coef
               + intercept)
