"""`rllib train`: SIGINT saves a checkpoint and exits non-zero; ``--resume`` continues from
the newest complete checkpoint with the same data position, recording no iteration twice,
and ends with the weights of an uninterrupted run.  The runs use a relative data path, so
this also checks that relative paths resolve against the launch folder (the trial runs in
Tune's folder)."""

from __future__ import annotations

import contextlib
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
    iterations = [json.loads(line)["training_iteration"]
                  for line in (trial / "result.json").read_text().splitlines()]
    assert iterations == [1, 2, 3, 4]  # nothing recorded twice
    final = _final_checkpoint(resumed_output)
    assert final.is_relative_to(run_dir)
    expected, got = _weights(_final_checkpoint(whole_output)), _weights(final)
    for key, value in expected.items():
        assert torch.equal(torch.as_tensor(got[key]), torch.as_tensor(value)), key


@pytest.mark.slow
def test_kill_9_of_the_driver_then_resume(tmp_path):
    """``kill -9`` leaves no time to save or to copy Tune's logs: the run continues from
    the newest complete checkpoint (Tune's snapshot may name none yet), and records no
    iteration twice."""
    _write_data(tmp_path)
    # Its own session, so that the Ray it started can be cleaned up after the kill.
    cut = _start([*SETTINGS, "--storage-path", "runs", "--name", "cut", "--checkpoint-freq",
                  "1"], tmp_path, start_new_session=True)
    try:
        seen, deadline = [], time.monotonic() + 400
        for line in cut.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if line.startswith("iter 2 "):
                cut.kill()  # SIGKILL
                break
            assert time.monotonic() < deadline, "".join(seen)
        cut.wait(timeout=60)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(cut.pid, signal.SIGKILL)  # the Ray processes it left
    assert cut.returncode == -signal.SIGKILL, "".join(seen)[-3000:]

    resumed = _start(["--resume", "runs/cut"], tmp_path)
    output = resumed.communicate(timeout=400)[0]
    assert resumed.returncode == 0, output[-3000:]
    found = re.search(r"resume GRPO_\S+: from checkpoint checkpoint_\d+ \(iteration (\d)\)",
                      output)
    assert found and int(found.group(1)) >= 1, output[-3000:]
    (trial,) = [p for p in (tmp_path / "runs" / "cut").iterdir()
                if (p / "result.json").is_file()]
    iterations = [json.loads(line)["training_iteration"]
                  for line in (trial / "result.json").read_text().splitlines()]
    # Rows Tune had not yet copied from the killed driver are lost; none is recorded twice.
    assert iterations == sorted(set(iterations)) and iterations[-1] == 4, iterations
    assert iterations[0] <= int(found.group(1)) + 1, iterations


def test_trim_results_drops_the_iterations_after_the_checkpoint(tmp_path):
    (tmp_path / "result.json").write_text(
        "".join(json.dumps({"training_iteration": i, "x": i}) + "\n" for i in (1, 2, 3))
        + '{"training_iteration": 4, "x"')  # a line cut short by the kill
    (tmp_path / "progress.csv").write_text("x,training_iteration\n1,1\n2,2\n3,3\n")
    assert trim_results(tmp_path, 2) == 2
    assert [json.loads(line)["training_iteration"] for line in
            (tmp_path / "result.json").read_text().splitlines()] == [1, 2]
    assert (tmp_path / "progress.csv").read_text() == "x,training_iteration\n1,1\n2,2\n"
