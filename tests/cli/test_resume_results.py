"""Tune's result files of a trial that starts again (`rllib_grpo.cli.resume`): cut in place
after the resume point, so that Tune's loggers (which keep them open) append after the kept
rows; a restored run takes the rows from storage, where every checkpoint put them."""

from __future__ import annotations

import csv
import io
import json
import types
from pathlib import Path

import pyarrow.fs

from rllib_grpo.cli.resume import ContinueTrialResults, recorded_iteration, trim_results
from rllib_grpo.rllib.algorithm.checkpoints import atomic_save, read_resume_point


def _rows(trial_dir: Path) -> tuple[list[int], list[int]]:
    """The iterations of result.json and of progress.csv."""
    result = [json.loads(line)["training_iteration"]
              for line in (trial_dir / "result.json").read_text().splitlines()]
    progress = [int(row["training_iteration"]) for row in csv.DictReader(io.StringIO(
        (trial_dir / "progress.csv").read_text(), newline=""))]
    return result, progress


def _write_results(trial_dir: Path, iterations: range, cut_last: bool = False) -> None:
    """Result files as Tune's loggers write them; a completions table (a value with line
    breaks) in every row; ``cut_last``: the last row cut short, as by ``kill -9``."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    rows = [{"training_iteration": i, "completions": f"| prompt |\n| {i} |"} for i in iterations]
    result = "".join(json.dumps(row) + "\n" for row in rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, list(rows[0]))  # Tune's CSV logger: csv's \r\n rows
    writer.writeheader()
    writer.writerows(rows)
    progress = out.getvalue()
    if cut_last:
        result, progress = result[:-9], progress[:-9]
    (trial_dir / "result.json").write_text(result)
    (trial_dir / "progress.csv").write_text(progress, newline="")


def _checkpoint(trial_dir: Path, index: int, iteration: int) -> None:
    def write(folder: str) -> None:
        (Path(folder) / "learner_group").mkdir(parents=True)
        (Path(folder) / "learner_group" / "state.pkl").write_bytes(b"weights")

    atomic_save(trial_dir / f"checkpoint_{index:06d}", write,
                components=lambda: ["learner_group"], iteration=iteration, run_id="run")


class _Trial:
    """What `ContinueTrialResults` reads of Tune's `Trial`."""

    def __init__(self, tmp_path: Path, checkpoint: Path | None = None) -> None:
        self.local_path = str(tmp_path / "driver" / "trial")
        self.path = str(tmp_path / "storage" / "trial")
        self.checkpoint = None if checkpoint is None else types.SimpleNamespace(
            path=str(checkpoint))
        self.storage = types.SimpleNamespace(storage_filesystem=pyarrow.fs.LocalFileSystem(),
                                             syncer=types.SimpleNamespace(wait=lambda: None))

    def init_local_path(self) -> None:
        Path(self.local_path).mkdir(parents=True, exist_ok=True)


def test_trimming_in_place_keeps_an_open_logger_appending_after_the_kept_rows(tmp_path):
    _write_results(tmp_path, range(1, 6))
    # Tune's loggers keep their files open (append mode) across a retry of the trial.
    json_log = (tmp_path / "result.json").open("a")
    csv_log = (tmp_path / "progress.csv").open("a", newline="")
    assert trim_results(tmp_path, 3) == 2
    json_log.write(json.dumps({"training_iteration": 4}) + "\n")
    json_log.close()
    csv.DictWriter(csv_log, ["training_iteration", "completions"]).writerow(
        {"training_iteration": 4, "completions": "| 4 |"})
    csv_log.close()
    assert _rows(tmp_path) == ([1, 2, 3, 4], [1, 2, 3, 4])


def test_a_row_cut_short_is_not_recorded_and_is_trimmed(tmp_path):
    _write_results(tmp_path, range(1, 5), cut_last=True)
    assert recorded_iteration(tmp_path) == 3
    trim_results(tmp_path, 3)
    assert _rows(tmp_path) == ([1, 2, 3], [1, 2, 3])


def test_a_restored_run_takes_the_rows_from_storage_up_to_the_resume_point(tmp_path):
    # kill -9 of the driver: its own copy is gone; storage holds rows 1-5 (the last checkpoint
    # put them there) and checkpoints at 2 and 4, and one at 6 whose rows never got there.
    storage = tmp_path / "storage" / "trial"
    _write_results(storage, range(1, 6))
    for index, iteration in enumerate((2, 4, 6)):
        _checkpoint(storage, index, iteration)
    trial = _Trial(tmp_path)  # Tune's snapshot names no checkpoint yet

    ContinueTrialResults().on_trial_start(0, [trial], trial)

    assert read_resume_point(storage) == (storage / "checkpoint_000001", 4)
    for folder in (storage, Path(trial.local_path)):  # the driver's copy, and storage's
        assert _rows(folder) == ([1, 2, 3, 4], [1, 2, 3, 4])


def test_a_retried_trial_keeps_the_drivers_own_rows(tmp_path):
    # A retry: the driver's copy has every row (storage only those of a sync long ago).
    trial = _Trial(tmp_path, checkpoint=tmp_path / "storage" / "trial" / "checkpoint_000000")
    storage, local = Path(trial.path), Path(trial.local_path)
    _write_results(local, range(1, 8))
    _write_results(storage, range(1, 3))
    _checkpoint(storage, 0, 3)
    _checkpoint(storage, 1, 6)

    ContinueTrialResults().on_trial_start(0, [trial], trial)

    assert read_resume_point(storage) == (storage / "checkpoint_000001", 6)
    assert _rows(local) == _rows(storage) == (list(range(1, 7)), list(range(1, 7)))


def test_a_checkpoint_of_another_trial_keeps_tunes_way(tmp_path):
    # PBT's exploit restores the donor's checkpoint: neither the rows nor a resume point.
    trial = _Trial(tmp_path, checkpoint=tmp_path / "storage" / "donor" / "checkpoint_000000")
    storage, local = Path(trial.path), Path(trial.local_path)
    _write_results(local, range(1, 5))
    _checkpoint(storage, 0, 2)

    ContinueTrialResults().on_trial_start(0, [trial], trial)

    assert read_resume_point(storage) is None
    assert _rows(local) == ([1, 2, 3, 4], [1, 2, 3, 4])


def test_a_registered_checkpoint_puts_the_rows_in_storage(tmp_path):
    trial = _Trial(tmp_path)
    _write_results(Path(trial.local_path), range(1, 4))
    ContinueTrialResults().on_checkpoint(0, [trial], trial, checkpoint=None)
    assert _rows(Path(trial.path)) == ([1, 2, 3], [1, 2, 3])


def test_a_continued_progress_csv_keeps_its_columns(tmp_path):
    # A restored algorithm reports its metrics in another order, with a new one.
    trial = _Trial(tmp_path)
    local = Path(trial.local_path)
    local.mkdir(parents=True)
    (local / "progress.csv").write_text("loss,training_iteration,date\r\n0.5,1,monday\r\n",
                                        newline="")
    results = ContinueTrialResults()
    results.log_trial_result(0, trial, {"date": "tuesday", "perf": {"cpu": 9.0},
                                        "training_iteration": 2, "loss": 0.25,
                                        "config": {"lr": 1.0}})
    results.log_trial_end(trial)
    assert (local / "progress.csv").read_bytes() == (
        b"loss,training_iteration,date\r\n0.5,1,monday\r\n0.25,2,tuesday\r\n")


def test_a_new_progress_csv_gets_the_first_results_columns(tmp_path):
    trial = _Trial(tmp_path)
    results = ContinueTrialResults()
    for iteration in (1, 2):
        results.log_trial_result(0, trial, {"training_iteration": iteration,
                                            "perf": {"cpu": 1.5}, "config": {"lr": 1.0}})
    results.log_trial_end(trial)
    assert (Path(trial.local_path) / "progress.csv").read_bytes() == (
        b"training_iteration,perf/cpu\r\n1,1.5\r\n2,1.5\r\n")
