"""Where start-up time goes: named intervals on one clock per process.

The seconds from launch to the first training step (``timing_s/startup``) split into
`STARTUP_PARTS`, each logged as ``timing_s/startup/<part>`` and shown on the console's
``start-up:`` line.  Code that starts something wraps it in `startup_part`:

* ``ray``: ``ray.init`` where the process that trains starts Ray (the demo);
* ``model``: building a built-in model into the cache (`rllib_grpo.models.model_registry`);
* ``engine``: creating a sampler in this process (its vLLM import, if not done, and the
  engine's start);
* ``learner``: building the learner group (the model, its optimizer, a reference);
* ``algorithm``: the rest of the algorithm's set-up (RLlib's env runner group, reward
  actors, remote env runners);
* ``other``: what no part covers: the interpreter, imports, configuration checks.

`startup_breakdown` gives each instant of ``[origin, end]`` to the innermost part
running then (the one started last: a part inside another counts as itself, not twice),
and every instant no part covers to ``other``, so the parts add up to the whole.  Parts
run in parallel threads would overlap: that time goes to the one started last.

Where the process that trains starts Ray, `rllib_grpo.init_local_ray` imports the run's
modules in a background thread at a lower priority during ``ray.init`` (its docstring has
the figures); that thread records no part of its own: its time is inside ``ray``, or
``other`` once Ray is up and the run waits for the imports.

Imports nothing of the package (layer 0): every layer may record a part.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

STARTUP_PARTS = ("ray", "model", "engine", "learner", "algorithm", "other")
STARTUP_KEY = "timing_s/startup"
_UNCOVERED = STARTUP_PARTS[-1]

Interval = tuple[str, float, float]  # (part, start, end) in time.time() seconds
_intervals: list[Interval] = []
_lock = threading.Lock()


def startup_part_key(part: str) -> str:
    """``timing_s/startup/<part>``: the result key of a part."""
    return f"{STARTUP_KEY}/{part}"


def record_part(part: str, start: float, end: float) -> None:
    """Record that ``part`` ran from ``start`` to ``end`` (``time.time()`` seconds)."""
    if part not in STARTUP_PARTS or part == _UNCOVERED:
        raise ValueError(f"start-up part {part!r}: use one of {STARTUP_PARTS[:-1]}")
    with _lock:
        _intervals.append((part, start, end))


@contextmanager
def startup_part(part: str) -> Iterator[None]:
    """Time the block as ``part`` of start-up (recorded even if it raises)."""
    start = time.time()
    try:
        yield
    finally:
        record_part(part, start, time.time())


def recorded_parts() -> list[Interval]:
    """Every interval recorded in this process so far."""
    with _lock:
        return list(_intervals)


def startup_breakdown(origin: float, end: float,
                      intervals: Iterable[Interval] | None = None) -> dict[str, float]:
    """Seconds of ``[origin, end]`` per part of `STARTUP_PARTS` (see the module
    docstring); the values add up to ``end - origin``.  ``intervals`` default to those
    recorded in this process (those outside ``[origin, end]`` count for nothing)."""
    spans = [(part, max(start, origin), min(stop, end), start)
             for part, start, stop in (recorded_parts() if intervals is None else intervals)
             if min(stop, end) > max(start, origin)]
    cuts = sorted({origin, end, *(s for _, s, _, _ in spans), *(e for _, _, e, _ in spans)})
    parts = dict.fromkeys(STARTUP_PARTS, 0.0)
    for a, b in zip(cuts, cuts[1:], strict=False):
        running = [(began, i) for i, (_, s, e, began) in enumerate(spans) if s <= a and e >= b]
        owner = spans[max(running)[1]][0] if running else _UNCOVERED
        parts[owner] += b - a
    return parts


def startup_summary(total: float, parts: dict[str, float]) -> str:
    """``11.6s (ray 2.1, engine 5.0, ..., other 1.2)``: parts under 0.05 s left out."""
    shown = ", ".join(f"{part} {parts[part]:.1f}" for part in STARTUP_PARTS
                      if parts.get(part, 0.0) >= 0.05)
    return f"{total:.1f}s ({shown})" if shown else f"{total:.1f}s"

