"""`rllib train`: SIGINT saves a checkpoint and exits non-zero; ``--resume`` continues from
the newest complete checkpoint with the same data position, and ends with the weights of an
uninterrupted run.  After ``kill -9`` of the driver, ``--resume`` (and, from Python,
``prepare_resume`` + ``tune.Tuner.restore``) continues from the newest checkpoint whose
results were recorded.  Either way ``result.json`` and ``progress.csv`` hold every iteration
once, from the first.  The runs use a relative data path, so this also checks that relative
paths resolve against the launch folder (the trial runs in Tune's folder)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rllib_grpo.cli.resume import trim_results
from rllib_grpo.rllib.algorithm.checkpoints import verify_checkpoint
from tests.conftest import REPO_ROOT

# Trainings in subprocesses, each on its own Ray.
pytestmark = pytest.mark.ray

RAY_LIMITS = ["--num-cpus", "2", "--object-store-memory", str(300 * 1024**2)]
SETTINGS = ["--env", "rllib_grpo/GSM8K-v0", "data.train_files=data/train.jsonl",
            "env_config={data_source: arithmetic}", "model_path=builtin:tiny", "sampler=hf",
            "prompts_per_step=4", "prompts_per_minibatch=4", "group_size=4", "max_prompt_length=16",
            "max_response_length=4", "lr=1e-2", "seed=0", "--stop",
            '{"training_iteration": 4}']


def _start(args: list[str], cwd: Path, **popen: object) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rllib_grpo.cli.main", "train", *args, *RAY_LIMITS]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)  # type: ignore[call-overload]


def _write_data(folder: Path) -> None:
    (folder / "data").mkdir()
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(8) for b in range(8)]
    (folder / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    verify_checkpoint(checkpoint)
    files = list((checkpoint / "learner_group").rglob("default_policy/module_state.pkl"))
    assert len(files) == 1, files
    with files[0].open("rb") as f:
        return pickle.load(f)


def _recorded(trial: Path) -> tuple[list[int], list[int]]:
    """The iterations ``result.json`` and ``progress.csv`` of a trial folder hold."""
    result = [json.loads(line)["training_iteration"]
              for line in (trial / "result.json").read_text().splitlines()]
    progress = [int(row["training_iteration"]) for row in csv.DictReader(io.StringIO(
        (trial / "progress.csv").read_text(), newline=""))]
    return result, progress


def _kill_at(process: subprocess.Popen, line_start: str) -> None:
    """``kill -9`` ``process`` (its own session, Ray included) once it prints a line
    starting with ``line_start``."""
    try:
        seen, deadline = [], time.monotonic() + 400
        for line in process.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith(line_start):
                process.kill()  # SIGKILL
                break
            assert time.monotonic() < deadline, "".join(seen)
        process.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # the Ray processes it left
    assert process.returncode == -signal.SIGKILL, "".join(seen)[-3000:]


def _final_checkpoint(output: str) -> Path:
    found = re.findall(r"^checkpoint: (.+)$", output, re.MULTILINE)
    assert found, output[-3000:]
    return Path(found[-1])


@pytest.mark.slow
def test_sigint_then_resume_matches_an_uninterrupted_run(tmp_path):
    _write_data(tmp_path)

    whole = _start([*SETTINGS, "--storage-path", "runs", "--name", "whole"], tmp_path)
    cut = _start([*SETTINGS, "--storage-path", "runs", "--name", "cut", "--checkpoint-freq",
                  "1"], tmp_path)
    seen, deadline = [], time.monotonic() + 400
    for line in cut.stdout:  # interrupt once iteration 2 is reported
        seen.append(line)
        if line.startswith("iter 2 "):
            cut.send_signal(signal.SIGINT)
            break
        assert time.monotonic() < deadline, "".join(seen)
    cut_output = "".join(seen) + cut.communicate(timeout=300)[0]
    whole_output = whole.communicate(timeout=400)[0]
    assert whole.returncode == 0, whole_output[-3000:]
    assert cut.returncode == 128 + signal.SIGINT, cut_output[-3000:]
    assert "interrupted by SIGINT" in cut_output and "rllib train --resume" in cut_output

    run_dir = tmp_path / "runs" / "cut"
    resumed = _start(["--resume", "runs/cut"], tmp_path)
    resumed_output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, resumed_output[-3000:]
    assert re.search(r"resume GRPO_\S+: from checkpoint checkpoint_\d+ \(iteration [23]\)",
                     resumed_output), resumed_output[-3000:]

    (trial,) = [p for p in run_dir.iterdir() if (p / "result.json").is_file()]
    assert _recorded(trial) == ([1, 2, 3, 4], [1, 2, 3, 4])  # each once


@pytest.mark.slow
def test_kill_9_of_the_driver_then_resume(tmp_path):
    """``kill -9`` leaves no time to save or to copy Tune's logs: the run continues from the
    newest checkpoint whose results reached storage (each registered checkpoint puts them
    there), whether Tune's snapshot names it or none, and records each iteration once."""
    _write_data(tmp_path)
    # Its own session, so that the Ray it started can be cleaned up after the kill.
    _kill_at(_start([*SETTINGS, "--storage-path", "runs", "--name", "cut",
                     "--checkpoint-freq", "1"], tmp_path, start_new_session=True), "iter 3 ")

    resumed = _start(["--resume", "runs/cut"], tmp_path)
    output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, output[-3000:]
    found = re.search(r"resume GRPO_\S+: from checkpoint checkpoint_\d+ \(iteration (\d)\)",
                      output)
    assert found and int(found.group(1)) >= 2, output[-3000:]
    assert "Failed to fetch metrics" not in output  # Tune found the results in storage
    (trial,) = [p for p in (tmp_path / "runs" / "cut").iterdir()
                if (p / "result.json").is_file()]
    assert _recorded(trial) == ([1, 2, 3, 4], [1, 2, 3, 4])


# The Python path: a Tuner with `ContinueTrialResults`, killed; then `prepare_resume` and
# `tune.Tuner.restore` (`python -c`, from the repository root, which has `tests`).
PYTHON_RUN = """
import sys
import ray
from ray import tune
from rllib_grpo.cli.resume import ContinueTrialResults
from rllib_grpo.cli.tune import ProgressPrinter
from rllib_grpo.rllib.algorithm import GRPO
from tests.conftest import tiny_config

ray.init(address="local", num_cpus=2, object_store_memory=300 * 1024**2,
         include_dashboard=False)
tune.Tuner(GRPO, param_space=tiny_config(), run_config=tune.RunConfig(
    storage_path=sys.argv[1], name="cut", stop={"training_iteration": 6}, verbose=0,
    callbacks=[ProgressPrinter(), ContinueTrialResults()],
    checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2))).fit()
"""


@pytest.mark.slow
def test_kill_9_of_a_python_tuner_then_restore(ray_session, tmp_path):
    from ray import tune

    from rllib_grpo.cli.resume import prepare_resume
    from rllib_grpo.rllib.algorithm import GRPO

    run = subprocess.Popen(
        [sys.executable, "-c", PYTHON_RUN, str(tmp_path)], cwd=REPO_ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True)
    _kill_at(run, "iter 3 ")  # checkpoint 2 is registered before iteration 3 reports

    run_dir = tmp_path / "cut"
    (line,) = prepare_resume(run_dir)
    found = re.search(r": from checkpoint checkpoint_\d+ \(iteration (\d)\)", line)
    assert found and int(found.group(1)) >= 2, line
    (result,) = tune.Tuner.restore(str(run_dir), trainable=GRPO, resume_unfinished=True,
                                   resume_errored=True).fit()
    assert result.error is None, result.error
    assert result.metrics["training_iteration"] == 6
    assert _recorded(Path(result.path)) == (list(range(1, 7)), list(range(1, 7)))


def test_trim_results_drops_the_iterations_after_the_checkpoint(tmp_path):
    (tmp_path / "result.json").write_text(
        "".join(json.dumps({"training_iteration": i, "x": i}) + "\n" for i in (1, 2, 3))
        + '{"training_iteration": 4, "x"')  # a line cut short by the kill
    (tmp_path / "progress.csv").write_text("x,training_iteration\n1,1\n2,2\n3,3\n")
    assert trim_results(tmp_path, 2) == 2
    assert [json.loads(line)["training_iteration"] for line in
            (tmp_path / "result.json").read_text().splitlines()] == [1, 2]
    assert (tmp_path / "progress.csv").read_text() == "x,training_iteration\n1,1\n2,2\n"
