"""`ResilientAlgorithm`: the fault-handling half of `GRPO` (its base class).

* Checkpoints are written atomically with a manifest of components and checksums, and
  refused on restore when a component is missing or corrupt
  (`rllib_grpo.rllib.algorithm.checkpoints`); ``keep_checkpoints`` prunes old ones.
* A restore restores the checkpoint named, into the learners and every sampler: the
  samplers take the restored weights even where they held newer ones (`restore_from_path`,
  `GRPO.set_state`).  A Tune trial that starts again (``Tuner.restore``, Tune's retry after
  a failure) continues from the resume point the driver recorded in its folder
  (`rllib_grpo.cli.resume.ContinueTrialResults`: the newest complete checkpoint whose
  results are recorded), whatever checkpoint Tune's (lagging) experiment snapshot names, or
  when it names none (the driver was killed before its snapshot recorded a checkpoint):
  such a trial restores itself before its first step.  Without a recorded point it
  restores what Tune names.
* A learner actor that dies fails the step with `LearnerDiedError`, naming the learner
  and what to do (Ray's own error names an actor id only).
* A run that learns nothing for ``max_skipped_steps`` steps in a row (every optimizer
  step skipped, or every reward call failed) stops with a message instead of running on.
* A lost remote env runner does not fail the step (`sample_on_runners`): its share is
  sampled again by the healthy runners, or, when none is left, by the runner Ray restarts
  (within ``env_runner_restart_timeout_s``).  A restarted runner gets the current weights
  and its data position (recorded after its last good sample) before it samples again
  (`restore_env_runners`), so no prompt is served twice; ``fault_tolerance/*`` metrics
  count the restarts.
* A remote env runner stuck in a call past its deadline (`rllib_grpo.rllib.algorithm.
  deadlines`) is named, every process's stack written to the trial folder, and restarted
  (`restart_stuck_runners`); its share is then sampled again as for a lost one
  (``fault_tolerance/env_runner_hangs`` counts them).  A learner stuck past its deadline
  stops the run (`HangError`).

The training loop itself lives in `rllib_grpo.rllib.algorithm.grpo.GRPO`.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core import (
    COMPONENT_LEARNER,
    COMPONENT_LEARNER_GROUP,
    COMPONENT_RL_MODULE,
    DEFAULT_MODULE_ID,
)
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import LEARNER_RESULTS, WEIGHTS_SEQ_NO
from ray.rllib.utils.typing import ResultDict

from rllib_grpo.rllib.algorithm.checkpoints import (
    atomic_save,
    prune_checkpoints,
    read_resume_point,
    verify_checkpoint,
)
from rllib_grpo.rllib.algorithm.deadlines import Deadlines, label_range

logger = logging.getLogger(__name__)
TUNE_CHECKPOINT_NAME = re.compile(r"checkpoint_\d+")


class LearnerDiedError(RuntimeError):
    """A learner actor died during a training step (its Ray error is the ``__cause__``)."""


class ResilientAlgorithm(Algorithm):
    """An `Algorithm` whose checkpoints are atomic, checked, and resumed from the newest."""

    deadlines: Deadlines  # made by the subclass's setup, before RLlib's (which it watches)

    @override(Algorithm)
    def setup(self, config: Any) -> None:
        super().setup(config)
        # Names this run's checkpoints (kept across restores) so pruning touches no others.
        self._checkpoint_run_id = uuid.uuid4().hex
        self._skipped_streak = 0
        # Each remote runner's state (data position, RNG) after its last good sample.
        self.runner_states: dict[int, dict] = {}
        self._num_runner_restarts = 0
        self._num_resampled_shares = 0
        self._num_runner_hangs = 0
        self._first_step_done = False

    @override(Algorithm)
    def step(self) -> ResultDict:
        """RLlib's step; before the first one a Tune trial that was not restored resumes
        itself from the resume point recorded in its folder, if any; a learner actor's
        death is re-raised naming the learner."""
        if not self._first_step_done:
            self._first_step_done = True
            if not self._restored:
                self._resume_own_trial()
        try:
            return super().step()
        except ray.exceptions.RayActorError as error:
            died = self._learner_died(error)
            if died is None:
                raise
            raise died from error

    def _resume_own_trial(self) -> None:
        """Restore the checkpoint the driver recorded as this Tune trial's resume point.

        Tune restores the checkpoint its experiment snapshot names before the first step;
        a trial that starts again without one (``Tuner.restore`` after ``kill -9`` of the
        driver, when the snapshot was written before the trial's first checkpoint) restores
        its resume point here."""
        point = self._resume_point()
        if point is not None and point[0] is not None:
            logger.warning("Resuming from %s (iteration %d), the newest complete checkpoint "
                           "of this trial whose results are recorded (Tune named none).",
                           point[0], point[1])
            self.restore(str(point[0]))

    def _resume_point(self) -> tuple[Path | None, int] | None:
        """Where the driver decided this Tune trial continues from (None: not decided)."""
        trial_dir = getattr(getattr(self, "_storage", None), "trial_fs_path", None)
        return read_resume_point(trial_dir) if trial_dir and Path(trial_dir).is_dir() else None

    def _learner_died(self, error: ray.exceptions.RayActorError) -> LearnerDiedError | None:
        """`LearnerDiedError` naming the learner when ``error`` is a learner actor's death;
        None when the actor is no learner (an env runner's death is handled elsewhere)."""
        manager = getattr(self.learner_group, "_worker_manager", None)
        actors = manager.actors() if manager is not None else {}
        index = next((i for i, actor in actors.items()
                      if actor._actor_id.hex() == getattr(error, "actor_id", None)), None)
        if index is None:
            return None
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return LearnerDiedError(
            f"learner {index} of {len(actors)} (Ray actor {error.actor_id}) died during "
            f"training step {self.iteration + 1}: {lines[-1] if lines else error}. Check "
            "its node's memory and the learner's log (`ray logs`); under `rllib train` the "
            "trial restarts from its newest complete checkpoint (--max-failures); from "
            "Python, build the algorithm again from the newest checkpoint "
            "(GRPO.from_checkpoint).")

    @contextlib.contextmanager
    def waiting_on_learners(self, phase: str, call: str, timeout_s: float | None = None,
                            rule: str | None = None) -> Iterator[None]:
        """A wait on the learners (``phase`` sets its deadline unless ``timeout_s``, ``rule``
        saying whence; ``call`` names it): past the deadline the run stops with `HangError`,
        the remote learners killed (a local learner's wait, in this process, interrupted)."""
        group = self.learner_group
        if group.is_local:
            with self.deadlines.watch(phase, f"the local learner ({call})", kill=False,
                                      timeout_s=timeout_s, rule=rule):
                yield
            return
        learners = dict(group._worker_manager.actors())
        with self.deadlines.watch(phase, f"{label_range('learner', list(learners))} ({call})",
                                  actors={f"learner {i}": h for i, h in learners.items()},
                                  interrupt=False, timeout_s=timeout_s, rule=rule):
            yield

    # ------------------------------------------------------------------ env runner faults
    def sample_on_runners(self, func: Callable[[Any, Any], Any], shares: list[Any], *,
                          phase: str = "sample", call: str = "sampling",
                          group: EnvRunnerGroup | None = None) -> list:
        """``func(runner, share)`` on every remote runner of ``group`` (default: the
        training runners), ``shares[i]`` for runner ``i + 1``; the results in runner order.
        A share whose runner is lost, or stuck past the deadline of ``phase``
        (`restart_stuck_runners`), is sampled again by a healthy runner, or by the
        restarted runner when none is healthy."""
        group = group or self.env_runner_group
        pending = {index: share for index, share in enumerate(shares, start=1) if share}
        results: dict[int, Any] = {}
        timeout = getattr(self.config, "env_runner_restart_timeout_s", 600.0)
        deadline = time.monotonic() + timeout
        first_round = True
        while pending:
            healthy = sorted(group.healthy_env_runner_ids())
            if healthy:
                # A lost runner's share goes to a healthy one (which draws from its own data).
                assignment: dict[int, list[int]] = {}
                for n, index in enumerate(sorted(pending)):
                    runner = index if index in healthy else healthy[n % len(healthy)]
                    assignment.setdefault(runner, []).append(index)
                if not first_round:
                    self._num_resampled_shares += len(pending)
                self._sample_round(func, pending, assignment, results, group, phase, call)
            first_round = False
            if not pending:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"env runner(s) {sorted(pending)} were lost and none came back within "
                    f"env_runner_restart_timeout_s={timeout:g} s (healthy runners: "
                    f"{group.num_healthy_remote_workers()}); see the runners' errors above.")
            if not self.restore_env_runners(group):
                time.sleep(1.0)
        self.log_fault_counts()
        return [results[index] for index in sorted(results)]

    def log_fault_counts(self) -> None:
        """This run's env runner restarts, shares sampled again and env runners restarted
        for a hang (every step's result)."""
        for key, count in (("env_runner_restarts", self._num_runner_restarts),
                           ("resampled_shares", self._num_resampled_shares),
                           ("env_runner_hangs", self._num_runner_hangs)):
            self.metrics.log_value(f"fault_tolerance/{key}", count, reduce="mean", window=1)

    def _sample_round(self, func: Callable[[Any, Any], Any], pending: dict[int, Any],
                      assignment: dict[int, list[int]], results: dict[int, Any],
                      group: EnvRunnerGroup, phase: str, call: str) -> None:
        """One ``foreach_env_runner``: each runner samples the shares assigned to it, within
        the deadline of ``phase`` (per share); a runner stuck past it is restarted."""
        work = {runner: [(index, pending[index]) for index in indices]
                for runner, indices in assignment.items()}

        def sample(er: Any, work: dict = work) -> list:
            done = [(index, func(er, share)) for index, share in work[er.worker_index]]
            return [(er.worker_index, done, er.get_state())]

        shares_per_runner = max(len(indices) for indices in work.values())
        timeout, rule = self.deadlines.timeout_and_rule(phase)
        timeout *= shares_per_runner
        t0 = time.monotonic()
        with self.deadlines.watch(phase, f"{label_range('env runner', list(work))} ({call})",
                                  timeout_s=math.inf, record=False):
            outs = group.foreach_env_runner(
                sample, local_env_runner=False, remote_worker_ids=list(work),
                healthy_only=True, timeout_seconds=timeout)
        returned = set()
        for runner, done, state in (item for out in outs for item in out):
            returned.add(runner)
            if group is self.env_runner_group:
                self.runner_states[runner] = state
            for index, result in done:
                results[index] = result
                pending.pop(index, None)
        stuck = [runner for runner in work if runner not in returned
                 and group._worker_manager.is_actor_healthy(runner)]
        if stuck:
            self.restart_stuck_runners(stuck, call, timeout, rule, group)
        elif len(returned) == len(work):
            self.deadlines.record(phase, (time.monotonic() - t0) / shares_per_runner)

    def restart_stuck_runners(self, stuck: list[int], call: str, timeout_s: float, rule: str,
                              group: EnvRunnerGroup | None = None,
                              then: str = "its share is sampled again") -> None:
        """Remote env runners ``stuck`` in ``call`` past ``timeout_s``: named, with every
        process's stack written to the trial folder, then restarted by Ray (killed; RLlib
        takes them out of service until they answer again, `restore_env_runners`); ``then``
        says what follows for the call."""
        group = group or self.env_runner_group
        actors = group._worker_manager.actors()
        report = self.deadlines.report(
            f"{label_range('env runner', stuck)} did not finish {call} within "
            f"{timeout_s:.0f} s ({rule}): restarting, {then}",
            actors={f"env runner {index}": actors[index] for index in stuck})
        logger.warning("%s", report)
        for index in stuck:
            try:
                ray.kill(actors[index], no_restart=False)
            except Exception as error:  # noqa: BLE001  (gone already: lost, as any other)
                logger.warning("env runner %d could not be restarted: %s", index, error)
            group._worker_manager.set_actor_state(index, healthy=False)
        self._num_runner_hangs += len(stuck)

    @override(Algorithm)
    def restore_env_runners(self, env_runner_group: EnvRunnerGroup) -> list[int]:
        """Bring restarted remote runners up to date before they sample: the learners'
        current weights, then the data position and RNG state each had after its last good
        sample (RLlib's default would restart its data from the beginning)."""
        if env_runner_group is not self.env_runner_group or not self.config.is_online:
            return super().restore_env_runners(env_runner_group)
        restored = env_runner_group.probe_unhealthy_env_runners()
        if not restored:
            return []
        weights = self.learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{DEFAULT_MODULE_ID}",
            inference_only=True)[COMPONENT_LEARNER]
        weights = {k: v for k, v in weights.items() if k in (COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO)}
        for index in restored:
            state = {**self.runner_states.get(index, {}), **weights}
            ref = ray.put(state)
            env_runner_group.foreach_env_runner(
                lambda er, ref=ref: er.set_state(ray.get(ref)), local_env_runner=False,
                remote_worker_ids=[index], timeout_seconds=self.config.env_runner_restore_timeout_s)
        self._num_runner_restarts += len(restored)
        logger.warning("Env runner(s) %s restarted; they got the current weights and their "
                       "data positions.", restored)
        return restored

    # ------------------------------------------------------------------ progress
    def _stop_if_nothing_learned(self, rollout: Any) -> None:
        """Count training steps in a row that learned nothing; raise after
        ``max_skipped_steps`` of them, saying why."""
        skipped = self.metrics.peek((LEARNER_RESULTS, DEFAULT_MODULE_ID, "actor/skipped_frac"),
                                    default=0.0)
        reward_failed = len(rollout) > 0 and bool(rollout.reward_errors.all())
        self._skipped_streak = self._skipped_streak + 1 if (
            skipped >= 1.0 or reward_failed) else 0
        self.metrics.log_value("train/skipped_steps_in_a_row", self._skipped_streak,
                               reduce="mean", window=1)
        limit = getattr(self.config, "max_skipped_steps", 0)
        if not limit or self._skipped_streak < limit:
            return
        if reward_failed:
            first = next((i.get("reward_error_message") for i in rollout.infos
                          if i.get("reward_error_message")), "")
            why = (f"every reward call failed (e.g. {first}); fix the reward function or "
                   "its inputs")
        else:
            why = ("every optimizer step was skipped for a non-finite gradient norm; check "
                   "the rewards' scale and lr")
        raise RuntimeError(f"Stopping: {self._skipped_streak} training steps in a row learned "
                           f"nothing: {why} (max_skipped_steps={limit}).")

    # ------------------------------------------------------------------ checkpoints
    @override(Algorithm)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's checkpoint, written atomically with a manifest of its components and
        checksums; with ``keep_checkpoints`` = K > 0 only this run's newest K checkpoints
        stay in the folder.  Remote filesystems get RLlib's plain save."""
        if filesystem is not None or "://" in str(path or ""):
            return super().save_to_path(path, state=state, filesystem=filesystem,
                                        use_msgpack=use_msgpack)
        target = Path(path) if path is not None else Path(tempfile.gettempdir()) / str(
            uuid.uuid4())
        save = super().save_to_path

        def components() -> list[str]:
            names = [name for name, _ in self.get_checkpointable_components()]
            return names if state is None else [n for n in names if n in state]

        iteration = self.training_iteration if state is None else state.get(
            "training_iteration", self.training_iteration)
        with self._waiting_on_checkpoint(f"checkpoint write to {target}"):
            written = atomic_save(
                target, lambda scratch: save(scratch, state=state, use_msgpack=use_msgpack),
                components=components, iteration=iteration, run_id=self._checkpoint_run_id)
        prune_checkpoints(Path(written).parent, self._checkpoint_run_id,
                          getattr(self.config, "keep_checkpoints", 0))
        return written

    @override(Algorithm)
    def restore_from_path(self, path, *args, **kwargs) -> None:
        """Refuse an incomplete or corrupt checkpoint (naming the component and file)
        before restoring anything; then RLlib's restore, and every sampler gets the
        restored weights."""
        if _is_local_checkpoint(path, kwargs):
            manifest = verify_checkpoint(path, required_components=[COMPONENT_LEARNER_GROUP])
            if manifest is not None:
                self._checkpoint_run_id = manifest["run_id"]
        with self._waiting_on_checkpoint(f"checkpoint restore from {path}"):
            super().restore_from_path(path, *args, **kwargs)
        component = kwargs.get("component")
        if component is None or component.startswith(COMPONENT_LEARNER_GROUP):
            self.samplers_take_restored_weights()

    @contextlib.contextmanager
    def _waiting_on_checkpoint(self, what: str) -> Iterator[None]:
        """A checkpoint's write or restore, within the deadline of the "checkpoint" phase:
        on expiry the run stops (the learners, whose state it gathers, killed; this
        process's own wait, on the filesystem, interrupted).  Without deadlines (a
        checkpoint written before the set-up made them) it runs as it is."""
        deadlines = getattr(self, "deadlines", None)
        group = getattr(self, "learner_group", None)
        if deadlines is None or group is None:
            yield
            return
        learners = {} if group.is_local else dict(group._worker_manager.actors())
        with deadlines.watch("checkpoint", f"the {what}",
                             actors={f"learner {i}": h for i, h in learners.items()}):
            yield

    def samplers_take_restored_weights(self) -> None:
        """After the learners were restored: every sampler (local, remote and evaluation
        env runners) loads the learners' weights and their version.

        A restored checkpoint carries the weights version it was saved at, older than the
        samplers' own after training went on, and a sampler skips weights no newer than
        its own (RLlib's rule, meant for syncs arriving out of order): the samplers forget
        their version first (`TextEnvRunner.forget_weights_version`), then the usual sync
        pushes the weights."""
        for group in (self.env_runner_group, self.eval_env_runner_group):
            if group is not None:
                group.foreach_env_runner(lambda runner: runner.forget_weights_version())
        self._sync_weights()

    def _sync_weights(self) -> None:
        """Push the learners' weights to every training sampler (`GRPO._sync_weights`)."""
        raise NotImplementedError

    @override(Algorithm)
    @classmethod
    def from_checkpoint(cls, path, filesystem=None, **kwargs) -> Algorithm:
        """Check the checkpoint is complete (components and file sizes) before building
        anything; the checksums are verified by `restore_from_path`."""
        if _is_local_checkpoint(path, {"filesystem": filesystem, **kwargs}):
            verify_checkpoint(path, required_components=[COMPONENT_LEARNER_GROUP],
                              checksums=False)
        return super().from_checkpoint(path, filesystem=filesystem, **kwargs)

    @override(Algorithm)
    def load_checkpoint(self, checkpoint_dir: str) -> None:
        """Restore the checkpoint named (`Trainable.restore`, PBT's exploit: the donor's
        state, iteration included), except when a Tune trial resumes itself.

        A trial that restores a checkpoint of its own trial folder is resuming
        (``Tuner.restore``, Tune's retry after a failure): it continues from the resume
        point the driver recorded there (the newest complete checkpoint whose results are
        recorded), since Tune's experiment snapshot is written every few seconds and can
        name an older checkpoint."""
        folder = Path(checkpoint_dir)
        point = self._resume_point() if self._is_own_trial_checkpoint(folder) else None
        if point is not None and point[0] is not None and point[0].resolve() != folder.resolve():
            logger.warning("Resuming from %s (iteration %d), the newest complete checkpoint "
                           "of this trial whose results are recorded, instead of %s.",
                           point[0], point[1], folder)
            checkpoint_dir = str(point[0])
        super().load_checkpoint(checkpoint_dir)

    def _is_own_trial_checkpoint(self, folder: Path) -> bool:
        """``folder`` is a Tune checkpoint of the trial this algorithm runs as."""
        storage = getattr(self, "_storage", None)
        trial_dir = getattr(storage, "trial_fs_path", None)
        return (trial_dir is not None and TUNE_CHECKPOINT_NAME.fullmatch(folder.name) is not None
                and folder.parent.resolve() == Path(trial_dir).resolve())

def _is_local_checkpoint(path: Any, kwargs: dict) -> bool:
    """A whole checkpoint on the local filesystem (not one component, not a remote URI).

    RLlib's ``Algorithm.from_checkpoint`` hands `restore_from_path` pyarrow's local
    filesystem; that is a local checkpoint too (verified like any other)."""
    import pyarrow.fs

    filesystem = kwargs.get("filesystem")
    return (kwargs.get("component") is None
            and (filesystem is None or isinstance(filesystem, pyarrow.fs.LocalFileSystem))
            and isinstance(path, str | Path) and "://" not in str(path))
