"""Continuous rollouts (``rollout_mode="continuous"``, ``max_staleness`` = K >= 1): the env
runners never stop generating; weights are loaded between two decode steps.

Each remote env runner runs a `rllib_grpo.rllib.env_runner.rollout_loop.RolloutLoop`: its
engine steps for as long as it has prompt groups, and a group is scored and queued the
moment its last response ends.  The driver keeps K steps' worth of groups
(K x ``prompts_per_step``) handed out and not yet trained; one step

1. **takes** finished groups from the runners' queues as they arrive (a short wait per
   round) until it has the step's groups, the oldest versions first; a group whose oldest
   token is more than K updates old is dropped and its prompt sampled again
   (``async/dropped_stale_groups``);
2. **tops up** the runners with new prompts (the prompt order moves on), so the engines
   stay full while the learner
3. **updates**; then
4. **publishes the new weights in flight**: every runner pauses between two engine steps,
   the weight sync runs as in the other modes (`SamplingStrategy.push_weights`), and each
   runner resumes: the tokens sampled from then on carry the new version, and each
   unfinished response continues under the new weights (``partial_rollout=True``) or is
   sampled again (``False``).

A response's staleness is its oldest token's (``weights_version`` = that token's version;
``RolloutBatch.token_versions`` per token).  Lost runners cost only their in-flight groups:
their prompts go to the healthy runners (or the restarted one).  Checkpoints hold no
in-flight groups: the saved prompt position is the first prompt not yet trained.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rllib_grpo.data.rollout import RolloutBatch, concat_rollouts
from rllib_grpo.rllib.algorithm.sampling.strategy import SamplingStrategy
from rllib_grpo.rllib.env_runner.rollout_loop import rollout_loop

TAKE_WAIT_S = 0.05  # each round of taking: how long a runner waits for a first group
DRIVER = 0  # the "runner" of a finished group the driver holds (remote runners count from 1)


class ContinuousSampling(SamplingStrategy):
    """Driver side of continuous rollouts (module docstring)."""

    def __init__(self, *args: Any, max_staleness: int, prompts_per_step: int,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_staleness = int(max_staleness)
        self.capacity = self.max_staleness * int(prompts_per_step)
        self._outstanding: dict[int, int] = {}  # data position -> runner (or DRIVER)
        self._ready: list[tuple[int, RolloutBatch]] = []  # taken, not yet trained
        self._claimed_end = 0
        self._suspended = False
        self._needs_sync = False
        self.dropped_stale_groups = 0
        self.lost_groups = 0
        self._busy_s: dict[int, float] = {}
        self._idle_s: dict[int, float] = {}
        self._restarted = 0

    # ---------------------------------------------------------------- runner calls
    def _on_runners(self, func: Callable[[Any], Any], ids: list[int] | None = None
                    ) -> dict[int, Any]:
        """``func(runner)`` on the runners ``ids`` (default: the healthy ones), by runner
        index, within the deadline of a runner call; a runner stuck past it is restarted
        (its prompts are then handed out again, as a lost runner's)."""
        group = self.runners
        ids = sorted(group.healthy_env_runner_ids()) if ids is None else ids
        if not ids:
            return {}
        deadlines = self.deadlines
        timeout, rule = deadlines.timeout_and_rule("runner_call") if deadlines else (None, "")
        t0 = time.monotonic()
        results = dict(group.foreach_env_runner(
            lambda er: (er.worker_index, func(er)), local_env_runner=False,
            remote_worker_ids=ids, healthy_only=True, timeout_seconds=timeout))
        healthy = set(group.healthy_env_runner_ids())
        stuck = [i for i in ids if i not in results and i in healthy]
        if stuck and timeout is not None:
            self.recovery.restart_stuck_runners(stuck, "a continuous-rollout call", timeout,
                                                rule)
        elif deadlines is not None and not stuck:
            deadlines.record("runner_call", time.monotonic() - t0)
        return results

    def _healthy(self) -> list[int]:
        healthy = sorted(self.runners.healthy_env_runner_ids())
        if not healthy:
            self.recovery.restore_env_runners(self.runners)
            healthy = sorted(self.runners.healthy_env_runner_ids())
        if not healthy:
            raise RuntimeError("rollout_mode='continuous': no healthy env runner is left "
                               "(see their errors above).")
        return healthy

    # ---------------------------------------------------------------- handing out prompts
    def _submit(self, positions: list[int]) -> None:
        """Hand ``positions`` to the healthy runners, the least loaded first."""
        healthy = self._healthy()
        load = {i: 0 for i in healthy}
        for runner in self._outstanding.values():
            if runner in load:
                load[runner] += 1
        work: dict[int, list[int]] = {i: [] for i in healthy}
        for position in positions:
            runner = min(load, key=lambda i: (load[i], i))
            work[runner].append(position)
            load[runner] += 1
            self._outstanding[position] = runner
        send = [i for i in healthy if work[i] or self._suspended]
        self._suspended = False
        self._on_runners(lambda er: rollout_loop(er).submit(work.get(er.worker_index, [])),
                         send)

    def _top_up(self) -> None:
        """New prompts for the runners, up to K steps' worth handed out."""
        need = self.capacity - len(self._outstanding)
        if need <= 0:
            return
        positions = [start + k for start, count in self.prompts.claim(need)
                     for k in range(count)]
        self._claimed_end = max(self._claimed_end, max(positions) + 1)
        self._submit(positions)

    def _take(self) -> None:
        """One round: the runners' finished groups; lost runners' prompts handed out again."""
        results: dict[int, dict[str, Any]] = self._on_runners(
            lambda er: rollout_loop(er).take(TAKE_WAIT_S))
        lost = set(self._outstanding.values()) - set(results) - {DRIVER}
        if lost:  # a lost runner costs only its in-flight groups: sampled again elsewhere
            positions = [p for p, r in self._outstanding.items() if r in lost]
            self.lost_groups += len(positions)
            self._submit(positions)
        metrics = []
        for index, out in sorted(results.items()):
            # (A group finished just before a restore's reset is no longer handed out.)
            groups = [(p, b) for p, b in out["groups"] if self._outstanding.get(p) == index]
            self._ready += groups
            for position, _ in groups:  # held here now: not lost with the runner
                self._outstanding[position] = DRIVER
            self._busy_s[index] = self._busy_s.get(index, 0.0) + out["busy_s"]
            self._idle_s[index] = self._idle_s.get(index, 0.0) + out["idle_s"]
            if out["groups"]:
                metrics.append(out["metrics"])
        if metrics:
            self.aggregate_runner_metrics(metrics)

    def _drop_stale(self) -> None:
        """Drop the held groups whose oldest token is now more than K updates old (a group
        may wait here while the learner moves on) and sample their prompts again."""
        def fresh(batch: RolloutBatch) -> bool:
            return self.learner_version - int(batch.weights_version.min()) <= self.max_staleness

        stale = [p for p, b in self._ready if not fresh(b)]
        if stale:
            self.dropped_stale_groups += len(stale)
            self._ready = [(p, b) for p, b in self._ready if fresh(b)]
            self._submit(stale)

    # ---------------------------------------------------------------- a step's groups
    def draw(self, num_prompts: int) -> RolloutBatch:
        """``num_prompts`` finished groups, the oldest weights first, as they arrive."""
        if self._needs_sync:  # after a restore: the runners get the restored weights
            self._needs_sync = False
            self._publish()
        elif self._suspended:
            self._on_runners(lambda er: rollout_loop(er).resume())
        self._suspended = False
        self._top_up()
        t0 = time.perf_counter()
        self._drop_stale()
        while len(self._ready) < num_prompts:
            self._take()
            self._drop_stale()
        self.log("async/wait_sample_s", time.perf_counter() - t0)
        self._ready.sort(key=lambda item: (int(item[1].weights_version.min()), item[0]))
        taken, self._ready = self._ready[:num_prompts], self._ready[num_prompts:]
        for position, _ in taken:
            self._outstanding.pop(position, None)
        return concat_rollouts([b for _, b in taken], pad_token_id=0)

    def sample(self, num_prompts: int) -> RolloutBatch:
        return self.draw(num_prompts)

    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:
        """Refill the engines (they generate during the update) and log the step's
        staleness, queue depth and runner idle share."""
        self._top_up()
        log = self.log
        versions = rollout.per_token_versions()
        trained = rollout.response_mask if rollout.loss_mask is None else rollout.loss_mask
        staleness = (self.learner_version - versions)[trained > 0]  # (env tokens: not)
        if staleness.size:
            log("async/token_staleness_mean", float(staleness.mean()))
            log("async/token_staleness_max", float(staleness.max()))
        response = (self.learner_version - rollout.weights_version).astype(np.float64)
        if response.size:
            log("async/staleness_mean", float(response.mean()))
            log("async/staleness_max", float(response.max()))
        log("async/dropped_stale_groups", self.dropped_stale_groups)
        log("async/lost_groups", self.lost_groups)
        log("async/queue_depth", len(self._ready))
        log("async/in_flight_groups", len(self._outstanding) - len(self._ready))
        self.recovery.log_fault_counts()

    def after_update(self) -> None:
        """Publish the new weights in flight: pause every runner between two engine steps,
        sync, resume (partial rollouts continue under the new version)."""
        self._learner_version = self.learner_version + 1
        self._publish()

    def _publish(self) -> None:
        t0 = time.perf_counter()
        ids = self._healthy()
        self._on_runners(lambda er: rollout_loop(er).pause(), ids)
        self.push_weights()
        resumed = self._on_runners(lambda er: rollout_loop(er).resume(), ids)
        seconds = time.perf_counter() - t0
        self._restarted += int(sum(r["restarted_requests"] for r in resumed.values()))
        log = self.log
        log("timing_s/update_weights", seconds)
        log("async/pauses_per_step", float(len(resumed)))
        log("async/pause_s", seconds)
        log("async/restarted_requests", float(self._restarted))

    def sampler_idle_frac(self, step_seconds: float) -> float:
        """The runners' idle share since the last step (mean over runners): seconds their
        loop had nothing to step (empty or paused) over its busy + idle seconds."""
        fracs = [self._idle_s[i] / max(self._idle_s[i] + self._busy_s[i], 1e-9)
                 for i in self._idle_s]
        self._busy_s, self._idle_s = {}, {}
        return float(np.mean(fracs)) if fracs else 0.0

    def settle(self) -> None:
        """Before a validation: the runners drop their running groups (started again after
        it) and pause; their weights are the newest already (synced after each update)."""
        self._on_runners(lambda er: rollout_loop(er).suspend())
        self._suspended = True

    def reset(self) -> None:
        """Forget everything in flight (after a restore): the restored data position is
        the first untrained prompt, sampled again with the restored weights (pushed to the
        runners, paused, before the next step takes anything)."""
        try:
            self._on_runners(lambda er: er.rollout_loop.reset()
                             if getattr(er, "rollout_loop", None) else None)
        except Exception:  # noqa: BLE001 - a runner lost meanwhile restarts on its own
            pass
        self._outstanding, self._ready, self._suspended = {}, [], False
        self._learner_version, self._claimed_end = None, 0
        self._needs_sync = True

    @property
    def in_flight_prompts(self) -> int:
        """From the first prompt not yet trained to the last handed out."""
        if not self._outstanding:
            return 0
        return self._claimed_end - min(self._outstanding)
