"""The training console: one line per iteration, or a progress bar with ETA on a terminal.

A line names the iteration and what a user watches: reward, accuracy (the reward
function's ``acc``), mean response length, KL loss, step time and tokens/s:

    iter  12  reward 0.562  acc 0.562  len 2.0  kl 0.0851  step 0.09s  3,412 tok/s

`Progress` prints these lines when the output is a file or a pipe, and draws a `tqdm`
bar (same numbers after it, an ETA before) when it is a terminal.  `rllib train` prints
the same line from its Tune callback (`rllib_grpo.cli.tune.ProgressPrinter`), and, while a
step waits longer than usual, what it waits on (`waiting_line`):

    waiting on env runner 2 (sampling) 45 s
"""

from __future__ import annotations

import dataclasses
import math
import sys
from collections.abc import Mapping
from typing import Any, TextIO

# The algorithm's first result: seconds from launch to the first training step.
STARTUP_KEY = "timing_s/startup"


@dataclasses.dataclass(frozen=True)
class Column:
    """One number of the progress line: its label (may be empty), the result keys to read
    (first found wins; ``a/b`` also finds ``result["a"]["b"]``), a format and a unit."""

    label: str
    keys: tuple[str, ...]
    fmt: str
    suffix: str = ""

    def render(self, result: Mapping[str, Any]) -> str | None:
        for key in self.keys:
            value = lookup(result, key)
            if isinstance(value, int | float) and not math.isnan(value):
                number = format(value, self.fmt) + self.suffix
                return f"{self.label} {number}" if self.label else number
        return None


COLUMNS: tuple[Column, ...] = (
    Column("reward", ("critic/score/mean",), ".3f"),
    Column("acc", ("reward/acc/mean",), ".3f"),
    Column("len", ("response_length/mean",), ".1f"),
    Column("kl", ("actor/kl_loss",), ".4f"),
    # RLlib's other algorithms: their return.
    Column("return", ("env_runners/episode_return_mean",), ".4g"),
    # Multi-turn envs: turns and tool calls per episode, tool calls that succeeded.
    Column("turns", ("num_turns/mean",), ".2f"),
    Column("tools/ep", ("tool_calls/per_episode",), ".2f"),
    Column("tool ok", ("tool_calls/success_rate",), ".2f"),
    Column("step", ("timing_s/step", "time_this_iter_s"), ".2f", "s"),
    Column("", ("perf/throughput",), ",.0f", " tok/s"),
)


def lookup(result: Mapping[str, Any], key: str) -> Any:
    """``result[key]``, else the nested ``result["a"]["b"]`` for ``key="a/b"``."""
    if key in result:
        return result[key]
    node: Any = result
    for part in key.split("/"):
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


def metrics_text(result: Mapping[str, Any]) -> str:
    """The progress line without the iteration: the `COLUMNS` found in ``result``."""
    return "  ".join(text for column in COLUMNS if (text := column.render(result)))


def progress_line(result: Mapping[str, Any], *, total: int | None = None,
                  prefix: str = "") -> str:
    """``iter N  reward ...`` for one training result (``total`` sets the number's width)."""
    iteration = result.get("training_iteration")
    width = len(str(total)) if total else 1
    head = f"{prefix}iter {iteration:>{width}}" if isinstance(iteration, int) else \
        f"{prefix}iter {iteration}"
    text = metrics_text(result)
    return f"{head}  {text}" if text else head


def waiting_line(waiting_on: str, seconds: float, *, prefix: str = "") -> str:
    """``waiting on env runner 2 (sampling) 45 s``: a wait of the run that lasts longer
    than usual, shown before it becomes a hang (`rllib_grpo.rllib.algorithm.deadlines`)."""
    return f"{prefix}waiting on {waiting_on} {seconds:.0f} s"


def startup_line(result: Mapping[str, Any]) -> str | None:
    """``start-up: 11.6s from launch to the first training step`` when the result carries
    ``timing_s/startup``."""
    seconds = lookup(result, STARTUP_KEY)
    if not isinstance(seconds, int | float) or math.isnan(seconds):
        return None
    return f"start-up: {seconds:.1f}s from launch to the first training step ({STARTUP_KEY})"


class Progress:
    """Shows each training result: a line per iteration, or a tqdm bar on a terminal.

    Args:
        total: iterations planned (the bar's length and ETA; an upper bound when training
            may stop early).
        stream: where to write (default stdout).
        bar: force the bar on or off; default: on when ``stream`` is a terminal.
    """

    def __init__(self, total: int | None = None, *, stream: TextIO | None = None,
                 bar: bool | None = None, description: str = "GRPO") -> None:
        self.total = total
        self.stream = stream or sys.stdout
        use_bar = self.stream.isatty() if bar is None else bar
        self._bar = None
        if use_bar:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=description, unit="it", file=self.stream,
                             dynamic_ncols=True, leave=True)
        self._startup_shown = False

    def update(self, result: Mapping[str, Any]) -> None:
        """Show one result (and, the first time it appears, the start-up time)."""
        if not self._startup_shown and (line := startup_line(result)):
            self._startup_shown = True
            self.write(line)
        if self._bar is None:
            self.write(progress_line(result, total=self.total))
            return
        self._bar.set_postfix_str(metrics_text(result), refresh=False)
        self._bar.update(1)

    def write(self, text: str) -> None:
        """A line of text that stays above the bar (or simply a line)."""
        if self._bar is None:
            print(text, file=self.stream, flush=True)
        else:
            self._bar.write(text, file=self.stream)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
