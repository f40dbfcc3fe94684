"""Fake parts for the sampling strategies' unit tests (no Ray): the collaborators a
`SamplingStrategy` is built from, recording each call in order, and small rollouts."""

from __future__ import annotations

import contextlib
from typing import Any


def groups_batch(versions: list[int], varied: list[bool] | None = None, first_group: int = 0):
    """Groups of 2 trajectories, group g sampled with ``versions[g]``; its two rewards
    differ when ``varied[g]`` (default: all do)."""
    from rllib_grpo.data.rollout import build_rollout_batch

    varied = varied or [True] * len(versions)
    rows = [(g, r) for g in range(len(versions)) for r in range(2)]
    batch = build_rollout_batch(
        [[1, 2]] * len(rows), [[3]] * len(rows), [[-0.5]] * len(rows),
        [float(r) if varied[g] else 0.0 for g, r in rows], [first_group + g for g, _ in rows],
        [False] * len(rows), [False] * len(rows), [{} for _ in rows], pad_token_id=0)
    batch.weights_version[:] = [versions[g] for g, _ in rows]
    return batch


class SampledRunner:
    """An env runner whose ``sample`` returns groups of ``version`` (recorded)."""

    def __init__(self, calls: list[str], index: int = 0, version: int = 0) -> None:
        self.calls, self.worker_index, self.version = calls, index, version

    def sample(self, num_prompts: int, start: int):
        self.calls.append(f"sample({num_prompts}@{start})")
        return groups_batch([self.version] * num_prompts, first_group=start)

    def get_metrics(self) -> dict:
        return {}

    def get_state(self) -> dict:
        return {"sampled_by": self.worker_index}


class Parts:
    """The collaborators of one strategy: weights, recovery, metrics (this object for all
    three) and a real `PromptOrder`; ``runners`` and ``learners`` are the test's."""

    def __init__(self, runners: Any = None, learners: Any = None) -> None:
        from rllib_grpo.rllib.algorithm.sampling import PromptOrder

        self.calls: list[str] = []
        self.logged: dict[str, float] = {}
        self.runner_states: dict[int, dict] = {}
        self.runners, self.learners = runners, learners
        self.prompts = PromptOrder()
        self.remote_runner = SampledRunner(self.calls, index=1)

    def kwargs(self) -> dict[str, Any]:
        return {"runners": self.runners, "learners": self.learners, "prompts": self.prompts,
                "weights": self, "recovery": self, "deadlines": None, "metrics": self}

    # the weight sync
    def sync(self) -> dict[str, float]:
        self.calls.append("sync_weights")
        return {"weight_sync/bytes": 1.0}

    # the recovery of lost runners
    def sample_on_runners(self, func, shares):
        self.calls.append("sample_on_runners")
        return [func(self.remote_runner, share) for share in shares]

    def restart_stuck_runners(self, stuck, call, timeout_s, rule) -> None:
        self.calls.append(f"restart{stuck}")

    def restore_env_runners(self, env_runner_group) -> list[int]:
        self.calls.append("restore")
        return []

    def log_fault_counts(self) -> None:
        self.calls.append("log_fault_counts")

    # the metrics logger
    def log_value(self, key: str, value: float, reduce: str, window: int) -> None:
        self.logged[key] = value

    def aggregate(self, metrics: list[dict], key: str) -> None:
        self.calls.append("runner_metrics")


class FakeDeadlines:
    """The run's deadlines: 5 s for every wait; each wait and each recorded one noted."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls

    def timeout_and_rule(self, phase: str) -> tuple[float, str]:
        return 5.0, "step_timeout_floor_s"

    @contextlib.contextmanager
    def watch(self, phase: str, waiting_on: str, **kwargs: Any):
        self.calls.append(f"waiting on {waiting_on}")
        yield

    def record(self, phase: str, seconds: float) -> None:
        self.calls.append(f"record {phase}")
