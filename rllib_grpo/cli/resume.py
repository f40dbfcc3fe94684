"""Interrupt and resume for `rllib train`.

* The first SIGINT (Ctrl+C) or SIGTERM asks every running trial to finish its current
  iteration, save a checkpoint and pause (`InterruptScheduler`); once none runs, Tune's
  loop is ended (through its own SIGUSR1 hook) and `rllib train` exits 130 / 143.  A
  second signal aborts at once.
* ``rllib train --resume RUN_DIR`` (`prepare_resume`, then ``tune.Tuner.restore``)
  continues each unfinished trial from its newest complete checkpoint
  (`rllib_grpo.rllib.algorithm.resilience.ResilientAlgorithm.load_checkpoint`), after trimming
  from its ``result.json`` and ``progress.csv`` the iterations after that checkpoint, so
  that no iteration is recorded twice.  It works after ``kill -9`` of the driver too:
  the algorithm is read from Tune's experiment state, and a trial whose snapshot names
  no checkpoint yet restores its newest one itself.
* A trial Tune retries after a failure (``--max-failures``) continues from its newest
  complete checkpoint as well; `TrimResultsOnRetry` trims its results to that checkpoint
  first, so the rows after it are replaced, never duplicated.

From Python: ``prepare_resume(path)`` then
``tune.Tuner.restore(path, trainable="GRPO", resume_unfinished=True, resume_errored=True)``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ray.tune import Callback
from ray.tune.schedulers import FIFOScheduler, TrialScheduler

from rllib_grpo.cli.errors import ConfigError
from rllib_grpo.rllib.algorithm.checkpoints import newest_complete_checkpoint

_INTERRUPT = threading.Event()
_SIGNAL: list[int] = []


# ----------------------------------------------------------------------------- interrupt
def interrupted() -> int | None:
    """The signal number that interrupted this run, or None."""
    return _SIGNAL[0] if _INTERRUPT.is_set() and _SIGNAL else None


def install_interrupt_handlers() -> None:
    """First SIGINT/SIGTERM: pause every trial after a checkpoint; a second one aborts.

    Tune's own SIGINT handler (which ends the loop without saving the trials) is turned
    off; its SIGUSR1 hook is what `InterruptScheduler` uses to end the loop."""
    os.environ["TUNE_DISABLE_SIGINT_HANDLER"] = "1"
    _INTERRUPT.clear()
    _SIGNAL.clear()

    def on_signal(signum: int, frame: Any) -> None:
        _SIGNAL.append(signum)
        _INTERRUPT.set()
        print(f"{signal.Signals(signum).name}: finishing the current iteration and saving a "
              "checkpoint; send it again to abort without saving", flush=True)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)


def restore_default_handlers() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class InterruptScheduler(FIFOScheduler):
    """FIFO, except that after an interrupt each trial pauses at its next result (Tune
    saves a checkpoint first) and no trial starts; when none is left running, Tune's
    loop is ended so the experiment state (trials paused at their newest checkpoint)
    is written for ``--resume``."""

    @classmethod
    def _interrupted(cls) -> bool:
        return _INTERRUPT.is_set()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict) -> str:
        if self._interrupted():
            return TrialScheduler.PAUSE
        return super().on_trial_result(tune_controller, trial, result)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        if not self._interrupted():
            return super().choose_trial_to_run(tune_controller)
        running = [t for t in tune_controller.get_trials() if t.status == "RUNNING"]
        if not running and not getattr(self, "_ended", False):
            self._ended = True
            os.kill(os.getpid(), signal.SIGUSR1)  # Tune's hook: snapshot state and return
        return None

    def __getstate__(self) -> dict:  # no run-time flag in tuner.pkl
        state = dict(self.__dict__)
        state.pop("_ended", None)
        return state


# ----------------------------------------------------------------------------- resume
def trial_dirs(run_dir: Path) -> list[Path]:
    """The trial folders of a Tune experiment folder: those with Tune's ``params.json`` or a
    checkpoint (after ``kill -9`` of the driver a folder may hold checkpoints only, as
    Tune copies its logs there every few seconds)."""
    return sorted(p for p in run_dir.iterdir() if p.is_dir() and (
        (p / "params.json").is_file() or any(p.glob("checkpoint_*"))))


def trainable_name(run_dir: Path) -> str:
    """The algorithm a run trained, as Tune's newest experiment state records it."""
    states = sorted(run_dir.glob("experiment_state-*.json"))  # Tune resumes the newest
    try:
        trials = json.loads(states[-1].read_text())["trial_data"] if states else []
        names = {json.loads(trial)["trainable_name"] for trial, _ in trials}
    except (ValueError, KeyError, TypeError) as error:
        raise ConfigError(f"--resume {run_dir}: unreadable experiment state {states[-1]}: "
                          f"{error}") from error
    if len(names) != 1:
        raise ConfigError(f"--resume {run_dir}: cannot tell which algorithm its trials ran "
                          f"({sorted(names) or 'no trials in its experiment state'})")
    return names.pop()


def prepare_resume(run_dir: str | os.PathLike) -> list[str]:
    """Check ``run_dir`` can be resumed; trim each trial's results to its newest complete
    checkpoint.  Returns one line per trial saying where it continues from."""
    from ray import tune

    run_dir = Path(run_dir).expanduser().absolute()
    if not run_dir.is_dir() or not tune.Tuner.can_restore(str(run_dir)):
        raise ConfigError(f"--resume {run_dir}: not a Tune experiment folder (the "
                          "'results:' folder `rllib train` printed)")
    lines = []
    for trial in trial_dirs(run_dir):
        newest = newest_complete_checkpoint(trial)
        iteration = newest[1] if newest else 0
        dropped = trim_results(trial, iteration)
        where = f"checkpoint {newest[0].name} (iteration {iteration})" if newest else "the start"
        lines.append(f"resume {trial.name}: from {where}"
                     + (f"; {dropped} later results dropped" if dropped else ""))
    return lines


def trim_results(trial_dir: Path, last_iteration: int) -> int:
    """Drop the rows after ``last_iteration`` from ``result.json`` and ``progress.csv``
    (they will be produced again).  Returns how many results were dropped."""
    dropped = 0
    result_json = trial_dir / "result.json"
    if result_json.is_file():
        kept = []
        for line in result_json.read_text().splitlines():
            try:
                keep = json.loads(line).get("training_iteration", 0) <= last_iteration
            except ValueError:
                keep = False  # a line cut short by the interruption
            if keep:
                kept.append(line)
            else:
                dropped += 1
        _replace_text(result_json, "".join(f"{line}\n" for line in kept))
    progress = trial_dir / "progress.csv"
    if progress.is_file():
        rows = list(csv.reader(io.StringIO(progress.read_text())))
        if rows and "training_iteration" in rows[0]:
            column = rows[0].index("training_iteration")
            body = [r for r in rows[1:] if len(r) > column and r[column].isdigit()
                    and int(r[column]) <= last_iteration]
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows([rows[0], *body])
            _replace_text(progress, out.getvalue())
    return dropped


class TrimResultsOnRetry(Callback):
    """When Tune retries a failed trial, it continues from the trial's newest complete
    checkpoint (`rllib_grpo.rllib.algorithm.resilience`): drop the results after that
    checkpoint from the driver's ``result.json`` and ``progress.csv`` (the complete ones),
    and put those in storage too, which Tune copies back when the trial restarts (its own
    copy there is synced every few seconds: stale), so the rows produced again replace
    them."""

    def on_trial_recover(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        local = Path(trial.local_path)
        storage = None if "://" in str(trial.path) else Path(trial.path)
        newest = newest_complete_checkpoint(storage) if storage and storage.is_dir() else None
        if local.is_dir():
            trim_results(local, newest[1] if newest else 0)
        if storage is None or not storage.is_dir() or storage.resolve() == local.resolve():
            return
        for name in ("result.json", "progress.csv"):
            if (local / name).is_file():
                _replace_text(storage / name, (local / name).read_text())


def _replace_text(path: Path, text: str) -> None:
    scratch = path.with_name(f".{path.name}.{time.monotonic_ns()}")
    scratch.write_text(text)
    os.replace(scratch, path)
