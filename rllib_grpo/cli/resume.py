"""Interrupt and resume for `rllib train`.

* The first SIGINT (Ctrl+C) or SIGTERM asks every running trial to finish its current
  iteration, save a checkpoint and pause (`InterruptScheduler`); once none runs, Tune's
  loop is ended (through its own SIGUSR1 hook) and `rllib train` exits 130 / 143.  A
  second signal aborts at once.
* `ContinueTrialResults` (a Tune callback and the run's CSV logger; `rllib train` passes
  it) keeps each trial's ``result.json`` and ``progress.csv`` whole across every restart
  of the trial: each iteration once, from the first, in order.  When Tune registers a
  checkpoint, the result files reach the trial's folder in storage at once; when a trial
  starts again (resumed, or retried after a failure with ``--max-failures``), it continues
  from the newest complete checkpoint whose iteration its results record, and the rows
  after that checkpoint are cut (they are produced again).
* ``rllib train --resume RUN_DIR`` (`prepare_resume`, then ``tune.Tuner.restore``)
  continues each unfinished trial that way, also after ``kill -9`` of the driver: the
  algorithm is read from Tune's experiment state, and a trial whose snapshot names no
  checkpoint yet restores its resume point itself
  (`rllib_grpo.rllib.algorithm.resilience.ResilientAlgorithm`).

From Python: run with ``tune.RunConfig(callbacks=[ContinueTrialResults()])``; to resume,
``prepare_resume(path)`` (a check) then
``tune.Tuner.restore(path, trainable="GRPO", resume_unfinished=True, resume_errored=True)``.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import shutil
import signal
import threading
import uuid
from itertools import accumulate
from pathlib import Path
from typing import Any, TextIO

import pyarrow.fs
from ray.air.constants import EXPR_PROGRESS_FILE, EXPR_RESULT_FILE
from ray.tune.logger import CSVLoggerCallback
from ray.tune.schedulers import FIFOScheduler, TrialScheduler
from ray.tune.utils import flatten_dict

from rllib_grpo.cli.errors import ConfigError
from rllib_grpo.rllib.algorithm.checkpoints import (
    clear_resume_point,
    newest_complete_checkpoint,
    write_resume_point,
)

logger = logging.getLogger(__name__)
RESULT_FILES = (EXPR_RESULT_FILE, EXPR_PROGRESS_FILE)  # Tune's result files of a trial
ITERATION = "training_iteration"

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
    """Check that ``run_dir`` can be resumed; one line per trial saying where it continues
    from (`resume_point`; `ContinueTrialResults` decides again as the trial starts)."""
    from ray import tune

    run_dir = Path(run_dir).expanduser().absolute()
    if not run_dir.is_dir() or not tune.Tuner.can_restore(str(run_dir)):
        raise ConfigError(f"--resume {run_dir}: not a Tune experiment folder (the "
                          "'results:' folder `rllib train` printed)")
    lines = []
    for trial in trial_dirs(run_dir):
        point = resume_point(trial)
        iteration = point[1] if point else 0
        later = sum(row > iteration for row, _ in result_rows(trial / EXPR_RESULT_FILE))
        where = f"checkpoint {point[0].name} (iteration {iteration})" if point else "the start"
        lines.append(f"resume {trial.name}: from {where}"
                     + (f"; {later} later results dropped" if later else ""))
    return lines


def resume_point(trial_dir: Path) -> tuple[Path, int] | None:
    """The newest complete checkpoint of ``trial_dir`` whose iteration its result files
    record (None: the start): the rows up to it are kept, so each iteration is recorded
    once whichever copy of the results survived."""
    return newest_complete_checkpoint(trial_dir, up_to=recorded_iteration(trial_dir))


class ContinueTrialResults(CSVLoggerCallback):
    """Keeps each trial's ``result.json`` and ``progress.csv`` whole across every restart
    of it (``Tuner.restore`` after an interrupt or ``kill -9`` of the driver, Tune's
    retries after a failure): each iteration once, from the first, in order.

    * When Tune registers a checkpoint, the driver's result files replace their copies in
      the trial's folder in storage (Tune copies them there every few seconds only), so
      the rows up to every checkpoint survive the driver.
    * When a trial starts, its result files are the driver's own (a retry) or, in a
      restored run, the copies in storage (Tune fetches those only when its experiment
      snapshot names a checkpoint).  The trial continues from `resume_point`, which is
      recorded in its folder for it to restore (`write_resume_point`;
      `rllib_grpo.rllib.algorithm.resilience.ResilientAlgorithm.load_checkpoint`), and
      the rows after that checkpoint are cut, in place: Tune's loggers keep the files
      open across a retry.
    * It is the run's CSV logger (Tune then adds none of its own): a ``progress.csv``
      continued after a restart keeps its header's columns, in their order (Tune's writes
      a restored algorithm's metrics, which come in another order, under the wrong
      columns).

    A trial restoring another trial's checkpoint (PBT's exploit) keeps Tune's way, as does
    a run whose storage is not a local (or mounted) filesystem.
    """

    def __init__(self) -> None:
        super().__init__()
        self._progress: dict[Any, tuple[TextIO, csv.DictWriter]] = {}

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        storage = _trial_folder_in_storage(trial)
        if storage is not None:
            self._continue_results(trial, storage)
        super().on_trial_start(iteration, trials, trial, **info)

    def _continue_results(self, trial: Any, storage: Path) -> None:
        named = trial.checkpoint  # what Tune restores; None: Tune starts the trial over
        if named is not None and Path(named.path).parent.resolve() != storage.resolve():
            clear_resume_point(storage)
            return
        local = Path(trial.local_path)
        local.mkdir(parents=True, exist_ok=True)
        for name in RESULT_FILES:
            if not (local / name).exists() and (storage / name).is_file():
                shutil.copyfile(storage / name, local / name)
        point = newest_complete_checkpoint(storage, up_to=recorded_iteration(local))
        if point is None and named is not None:
            logger.warning("%s: its results do not reach its checkpoint %s; it continues "
                           "from there with the rows before it missing.", trial, named.path)
            clear_resume_point(storage)
            return
        trim_results(local, point[1] if point else 0)
        _persist_results(trial, local, storage)
        write_resume_point(storage, point)

    def on_checkpoint(self, iteration: int, trials: list, trial: Any, checkpoint: Any,
                      **info: Any) -> None:
        storage = _trial_folder_in_storage(trial)
        if storage is not None and Path(trial.local_path).is_dir():
            _persist_results(trial, Path(trial.local_path), storage)

    # ------------------------------------------------------------------ progress.csv
    def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
        if trial not in self._progress:
            self._progress[trial] = self._open_progress(trial, result)
        file, writer = self._progress[trial]
        writer.writerow(flatten_dict({k: v for k, v in result.items() if k != "config"},
                                     delimiter="/"))
        file.flush()

    def log_trial_end(self, trial: Any, failed: bool = False) -> None:
        opened = self._progress.pop(trial, None)
        if opened is not None:
            opened[0].close()

    def _open_progress(self, trial: Any, result: dict) -> tuple[TextIO, csv.DictWriter]:
        """The trial's ``progress.csv``, to append to: the columns of its header, or of this
        first result in a new file (later keys are left out, as by Tune's logger)."""
        trial.init_local_path()
        if _trial_folder_in_storage(trial) is None:  # else `on_trial_start` fetched it
            self._restore_from_remote(EXPR_PROGRESS_FILE, trial)
        path = Path(trial.local_path, EXPR_PROGRESS_FILE)
        header = progress_header(path)
        file = path.open("a", newline="")
        writer = csv.DictWriter(file, header or list(flatten_dict(
            {k: v for k, v in result.items() if k != "config"}, delimiter="/")),
            extrasaction="ignore")
        if header is None:
            writer.writeheader()
        return file, writer


def _trial_folder_in_storage(trial: Any) -> Path | None:
    """The trial's folder in storage, where that is a local (or mounted) filesystem."""
    if not isinstance(trial.storage.storage_filesystem, pyarrow.fs.LocalFileSystem):
        return None
    return Path(trial.path)


def _persist_results(trial: Any, local: Path, storage: Path) -> None:
    """The driver's result files of ``trial`` replace their copies in storage."""
    try:  # a sync of the driver's folder still running would overwrite them with older ones
        trial.storage.syncer.wait()
    except Exception as error:  # noqa: BLE001 - Tune reports its own sync failures
        logger.warning("%s: Tune's sync to storage failed (%s); copying its results "
                       "anyway.", trial, error)
    storage.mkdir(parents=True, exist_ok=True)
    for name in RESULT_FILES:
        if (local / name).is_file():
            scratch = storage / f".{name}.{uuid.uuid4().hex[:8]}"
            shutil.copyfile(local / name, scratch)
            os.replace(scratch, storage / name)


# ----------------------------------------------------------------------------- result rows
def result_rows(path: Path) -> list[tuple[int, int]]:
    """``(training_iteration, end offset)`` of each row at the start of Tune's
    ``result.json``, up to the first that is not a whole row (one cut short by a kill)."""
    if not path.is_file():
        return []
    rows = []
    lines = _lines(path.read_bytes())
    for line, end in zip(lines, accumulate(map(len, lines)), strict=True):
        try:
            if not line.endswith(b"\n"):
                break
            rows.append((int(json.loads(line)[ITERATION]), end))
        except (ValueError, KeyError, TypeError):
            break
    return rows


def progress_rows(path: Path) -> tuple[int, list[tuple[int, int]]] | None:
    """``(end offset of the header, [(training_iteration, end offset) per row])`` of Tune's
    ``progress.csv`` (a row may span lines: a quoted value with line breaks), up to the
    first row that is not whole; None without a header naming the iteration."""
    if not path.is_file():
        return None
    lines = _lines(path.read_bytes())
    ends = list(accumulate(map(len, lines)))
    reader = csv.reader(line.decode("utf-8", "replace") for line in lines)
    header = next(reader, None) if lines and lines[0].endswith(b"\n") else None
    if header is None or ITERATION not in header:
        return None
    column, header_end = header.index(ITERATION), ends[reader.line_num - 1]
    rows: list[tuple[int, int]] = []
    try:
        for record in reader:
            last = reader.line_num - 1
            if not lines[last].endswith(b"\n") or len(record) <= column:
                break
            rows.append((int(record[column]), ends[last]))
    except (csv.Error, ValueError):
        pass  # a row cut short, or not a row: the rows before it
    return header_end, rows


def progress_header(path: Path) -> list[str] | None:
    """The columns named by the header of a ``progress.csv`` (None: no file, or no whole
    header line)."""
    if not path.is_file():
        return None
    lines = _lines(path.read_bytes())
    if not lines or not lines[0].endswith(b"\n"):
        return None
    return next(csv.reader([lines[0].decode("utf-8", "replace")]))


def recorded_iteration(trial_dir: Path) -> int:
    """The last iteration both result files of ``trial_dir`` record (that of the one
    there is, where only one is; 0 without rows)."""
    last = []
    if (trial_dir / EXPR_RESULT_FILE).is_file():
        rows = result_rows(trial_dir / EXPR_RESULT_FILE)
        last.append(rows[-1][0] if rows else 0)
    progress = progress_rows(trial_dir / EXPR_PROGRESS_FILE)
    if progress is not None:
        last.append(progress[1][-1][0] if progress[1] else 0)
    return min(last, default=0)


def trim_results(trial_dir: Path, last_iteration: int) -> int:
    """Cut ``result.json`` and ``progress.csv`` of ``trial_dir`` after the rows up to
    ``last_iteration`` (the rows after it will be produced again).  Each file is cut in
    place to a prefix of itself: Tune's loggers, which keep it open to append, go on
    writing at its new end.  Returns how many lines of ``result.json`` were cut."""
    dropped = 0
    result_json = trial_dir / EXPR_RESULT_FILE
    if result_json.is_file():
        end = _end_of_rows(result_rows(result_json), last_iteration, 0)
        dropped = len(_lines(result_json.read_bytes()[end:]))
        os.truncate(result_json, end)
    progress = progress_rows(trial_dir / EXPR_PROGRESS_FILE)
    if progress is not None:
        header_end, rows = progress
        os.truncate(trial_dir / EXPR_PROGRESS_FILE, _end_of_rows(rows, last_iteration,
                                                                 header_end))
    return dropped


def _end_of_rows(rows: list[tuple[int, int]], last_iteration: int, start: int) -> int:
    """The end offset of the rows before the first one after ``last_iteration``."""
    end = start
    for iteration, row_end in rows:
        if iteration > last_iteration:
            break
        end = row_end
    return end


def _lines(data: bytes) -> list[bytes]:
    """``data`` split after each newline byte, which each line keeps (the last line may
    have none: a row cut short)."""
    lines = [line + b"\n" for line in data.split(b"\n")]
    lines[-1] = lines[-1][:-1]
    return lines if lines[-1] else lines[:-1]
