"""One-step-off-policy GRPO: generation of step k+1 overlaps training on step k.

With ``max_staleness`` = K >= 1 (and remote env runners) one `GRPO.training_step` runs

    take the groups sampled in the background (wait if they are not done)
    -> sync the newest weights to the env runners (they are idle now: never mid-generation)
    -> launch the next step's sampling in the background (Ray async actor calls)
    -> update the learner on the groups taken

so the env runners generate batch k+1 while the learner trains on batch k.  Every
trajectory carries the policy version (learner updates done) of the weights that sampled
it; a group comes from one sample call, so it never mixes versions.  A group older than
K updates is dropped before training and sampled again (``async/dropped_stale_groups``);
the pipeline is one step deep, so in steady state every trained group is exactly one
update old (staleness 1) and K >= 2 only loosens the bound (docs/async.md says why a
deeper pipeline would not raise the steady rate).  The old log-probs are the learner's
(from the update's own forward on a one-mini-batch step, else a pass of their own:
`rllib_grpo.rllib.config.staleness.old_log_probs_from_update`) and the sampler's are kept, so
``rollout_is`` weighs the gap.

A lost runner's share of the background request is sampled again at once
(`RunnerRecovery.sample_on_runners`), and so is a stuck runner's once it is restarted (the
request has the sampling deadline, counted from its launch).  Checkpoints hold no
in-flight samples: the saved prompt position is where the untrained groups began, so a
restored run samples those prompts again with its own weights.
"""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import numpy as np

from rllib_grpo.data.recipes import first_groups
from rllib_grpo.data.rollout import RolloutBatch, concat_rollouts
from rllib_grpo.rllib.algorithm.deadlines import label_range
from rllib_grpo.rllib.algorithm.sampling.strategy import SamplingStrategy

_REQUEST_IDS = itertools.count()


# --------------------------------------------------------------------------- runner side
def _sample_share(runner: Any, work: dict[int, tuple[int, int]]) -> tuple:
    """One runner's share of a background request, with its state after it (for restarts)."""
    start, count = work[runner.worker_index]
    t0 = time.perf_counter()
    batch = runner.sample(num_prompts=count, start=start)
    seconds = time.perf_counter() - t0
    return runner.worker_index, batch, runner.get_metrics(), runner.get_state(), seconds


# --------------------------------------------------------------------------- the driver
class PipelinedSampling(SamplingStrategy):
    """Driver side of one-step-off-policy sampling (``max_staleness`` >= 1)."""

    def __init__(self, *args: Any, max_staleness: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_staleness = int(max_staleness)
        self._runner_version: int | None = 0  # what the runners hold (setup pushed v0)
        self._tag: str | None = None  # the background request in flight
        self._sent: list[int] = []  # the runners it went to, and when (monotonic)
        self._launched = 0.0
        self._shares: dict[int, tuple[int, int]] = {}  # runner -> (start, count)
        self._ready: RolloutBatch | None = None  # taken from the runners, not yet trained
        self._ready_prompts = 0
        self.dropped_stale_groups = 0

    # ---------------------------------------------------------------- versions
    def after_update(self) -> None:
        """The learner took one update (its version moved by one); the runners are busy:
        they get the weights when their generation ends."""
        self._learner_version = self.learner_version + 1

    def sync_if_behind(self) -> None:
        """Push the learner's weights when the (idle) runners hold older ones."""
        if self._runner_version != self.learner_version:
            self.sync_weights()
            self._runner_version = self.learner_version

    # ---------------------------------------------------------------- background requests
    @property
    def in_flight_prompts(self) -> int:
        return sum(count for _, count in self._shares.values()) + self._ready_prompts

    def launch(self, num_prompts: int) -> None:
        """Start sampling the next step's ``num_prompts`` groups in the background, on the
        runners' current weights (call with the runners idle and synced)."""
        group = self.runners
        slices = self.prompts.claim(num_prompts, group.num_remote_env_runners())
        self._shares = {index: share for index, share in enumerate(slices, start=1)
                        if share[1]}
        healthy = set(group.healthy_env_runner_ids())
        send = sorted(i for i in self._shares if i in healthy)
        self._tag = f"rllib_grpo_sample_{next(_REQUEST_IDS)}"
        self._sent, self._launched = send, time.monotonic()
        if send:  # an unhealthy runner's share is sampled again when the request is taken
            group.foreach_env_runner_async(
                lambda er, work=dict(self._shares): _sample_share(er, work),
                tag=self._tag, remote_worker_ids=send)

    def _collect(self) -> None:
        """Wait for the background request, within its deadline (from its launch); a lost
        runner's share is sampled again, as is a stuck one's once it is restarted."""
        group = self.runners
        t0 = time.perf_counter()
        results: dict[int, tuple] = {}
        if group.num_in_flight_async_reqs(self._tag):
            for index, out in self._fetch(group):
                results[index] = out
        waited = time.perf_counter() - t0
        missing = [i for i in self._shares if i not in results]
        if missing:  # lost runners: the same positions, by a healthy or restarted runner
            num_runners = max(self._shares)
            shares = [self._shares[i] if i in missing else None
                      for i in range(1, num_runners + 1)]
            redone = self.recovery.sample_on_runners(lambda er, part: _sample_share(
                er, {er.worker_index: part}), shares)
            for (_, batch, metrics, state, seconds), index in zip(redone, missing, strict=True):
                results[index] = (index, batch, metrics, state, seconds)
        self.recovery.log_fault_counts()  # (sample_on_runners logs them only when it ran)
        ordered = [results[i] for i in sorted(results)]
        for index, _, _, state, _ in ordered:
            self.recovery.runner_states[index] = state
        self.aggregate_runner_metrics([m for _, _, m, _, _ in ordered])
        batches = [b for _, b, _, _, _ in ordered if len(b)]
        if not batches:
            raise RuntimeError("None of the env runners returned samples for the background "
                               "request (see their errors above); healthy runners: "
                               f"{group.num_healthy_remote_workers()}.")
        self._ready = concat_rollouts(batches, pad_token_id=0)
        self._ready_prompts = sum(count for _, count in self._shares.values())
        self._tag, self._shares = None, {}
        self.log("async/wait_sample_s", waited)

    def _fetch(self, group: Any) -> list[tuple[int, Any]]:
        """The background request's results; a runner that has not answered within the
        sampling deadline, counted from the launch, is restarted (its share is then missing
        and sampled again)."""
        deadlines = self.deadlines
        if deadlines is None:
            return list(group.fetch_ready_async_reqs(tags=self._tag, timeout_seconds=None))
        timeout, rule = deadlines.timeout_and_rule("sample")
        sent = sorted(self._sent)
        with deadlines.watch("sample", f"{label_range('env runner', sent)} (sampling)",
                             timeout_s=math.inf, record=False):
            ready = list(group.fetch_ready_async_reqs(
                tags=self._tag, timeout_seconds=max(0.0, self._launched + timeout
                                                    - time.monotonic())))
        answered, healthy = {index for index, _ in ready}, set(group.healthy_env_runner_ids())
        stuck = [i for i in sent if i not in answered and i in healthy]
        if stuck:
            self.recovery.restart_stuck_runners(stuck, "sampling", timeout, rule)
        else:
            deadlines.record("sample", time.monotonic() - self._launched)
        return ready

    def settle(self) -> None:
        """Take the background request (kept for the next step) and sync the weights, so
        the runners hold the newest policy (before a validation)."""
        if self._tag is not None:
            self._collect()
        self.sync_if_behind()

    # ---------------------------------------------------------------- a step's groups
    def draw(self, num_prompts: int) -> RolloutBatch:
        """One generation batch: the background one if there is one (groups older than
        ``max_staleness`` updates dropped), else ``num_prompts`` groups sampled now with the
        newest weights."""
        if self._tag is not None:
            self._collect()
        if self._ready is not None:
            batch, self._ready, self._ready_prompts = self._ready, None, 0
            return self._drop_stale(batch)
        self.sync_if_behind()
        return self.sample_now(num_prompts)

    def sample(self, num_prompts: int) -> RolloutBatch:
        """``num_prompts`` groups of at most ``max_staleness`` updates (without dynamic
        sampling); dropped stale groups are replaced by fresh ones."""
        batches, num_groups = [], 0
        while num_groups < num_prompts:
            batch = self.draw(num_prompts - num_groups)
            if len(batch):
                batches.append(batch)
                num_groups += batch.num_groups
        return first_groups(concat_rollouts(batches, pad_token_id=0), num_prompts)

    def _drop_stale(self, batch: RolloutBatch) -> RolloutBatch:
        staleness = self.learner_version - batch.weights_version
        keep = staleness <= self.max_staleness
        if keep.all():
            return batch
        self.dropped_stale_groups += len(np.unique(batch.group_index[~keep]))
        return batch.select(np.flatnonzero(keep))

    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:
        """The step's groups are taken: log their staleness, bring the runners to the
        newest weights and launch the next step's sampling, all before the update."""
        staleness = (self.learner_version - rollout.weights_version).astype(np.float64)
        if staleness.size:
            self.log("async/staleness_mean", float(staleness.mean()))
            self.log("async/staleness_max", float(staleness.max()))
        self.log("async/dropped_stale_groups", self.dropped_stale_groups)
        self.sync_if_behind()
        self.launch(next_prompts)

    def reset(self) -> None:
        """Forget the in-flight samples and the versions (after a restore)."""
        if self._tag is not None:
            try:  # drain, so the runners' request counters are free again; results dropped
                self.runners.fetch_ready_async_reqs(tags=self._tag, timeout_seconds=None)
            except Exception:  # noqa: BLE001 - a runner lost meanwhile restarts on its own
                pass
        self._tag, self._shares, self._ready, self._ready_prompts = None, {}, None, 0
        self._learner_version, self._runner_version = None, None
