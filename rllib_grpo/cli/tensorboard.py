"""TensorBoard output with tensorboardX: scalar metrics under verl's names, and
sampled completions as a text table."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

from tensorboardX import SummaryWriter

from rllib_grpo.rllib.learner.perf import LEARNER_METRIC_NAMESPACES

# Result keys worth plotting (verl names and RLlib's own summaries).
# The learner's namespaces (one list, the learner's) and the driver's and env runners'.
SCALAR_PREFIXES = (
    *LEARNER_METRIC_NAMESPACES, "response_length/", "prompt_length/", "groups/", "reward/",
    "weight_sync/", "num_turns/", "tool_calls/", "episode_length/", "episode/",
)


def flatten(result: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested result dict -> ``{"a/b/c": value}``."""
    flat: dict[str, Any] = {}
    for key, value in result.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten(value, name + "/"))
        else:
            flat[name] = value
    return flat


def scalar_metrics(result: Mapping[str, Any]) -> dict[str, float]:
    """The finite numeric top-level GRPO metrics of a training result (a metric logged only
    on some steps, such as validation, reads NaN on the others: nothing to plot)."""
    return {
        k: float(v) for k, v in flatten(result).items()
        if k.startswith(SCALAR_PREFIXES) and isinstance(v, numbers.Real) and math.isfinite(v)
    }


def completions_table(infos: list[dict[str, Any]], limit: int = 8) -> str:
    """A markdown table of prompt / response / reward rows (TensorBoard renders markdown).

    Multi-turn episodes (infos with a ``conversation``) show the whole conversation, one
    ``role: text`` line per turn, in the response cell.
    """
    rows = ["| prompt | response | reward | acc |", "|---|---|---|---|"]
    for info in infos[:limit]:
        if "conversation" in info:
            cells = [_cell(info.get("prompt", "")), _conversation_cell(info["conversation"])]
        else:
            cells = [_cell(info.get(k, "")) for k in ("prompt", "response")]
        cells += [_cell(info.get(k, "")) for k in ("reward", "acc")]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


CONVERSATION_CHARS = 2000


def _cell(value: Any, limit: int = 200) -> str:
    """One table cell on one line, pipes escaped."""
    return str(value).replace("|", "\\|").replace("\n", " ")[:limit]


def _conversation_cell(text: str) -> str:
    """A whole conversation in one cell: a line per turn; tags like <tool> shown, not parsed
    as HTML."""
    text = text[:CONVERSATION_CHARS].replace("|", "\\|").replace("&", "&amp;")
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", "<br>")


class TensorBoardLogger:
    """Writes one training result per step; completions every ``completions_every`` steps."""

    def __init__(self, logdir: str, completions_every: int = 1) -> None:
        self.writer = SummaryWriter(logdir)
        self.completions_every = completions_every

    def log(self, result: Mapping[str, Any], step: int,
            infos: list[dict[str, Any]] | None = None) -> None:
        for key, value in scalar_metrics(result).items():
            self.writer.add_scalar(key, value, step)
        if infos and self.completions_every and step % self.completions_every == 0:
            self.writer.add_text("completions", completions_table(infos), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
