"""`python -m rllib_grpo.demo`'s console, end to end: progress lines with the metrics a user
watches, the start-up time, where the outputs are, and none of the libraries' noise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_grpo.logs import KNOWN_NOISE

# Each test runs the demo, which starts its own Ray.
pytestmark = pytest.mark.ray

# What /work/shared/checks/quiet-demo.sh counts as a progress line.
PROGRESS = re.compile(r"^\s*(iter|step)|it/s|%\||reward|━|█")
# Banners and per-step lines seen before the console was quieted (Ray, RLlib, vLLM, tqdm).
NOISE = re.compile("|".join([
    *(noise.pattern.lstrip("^") for noise in KNOWN_NOISE),
    r"\bINFO\b", r"Warning", r"WARNING", r"Loading weights", r"Writing model shards",
    r"Reloading weights inplace", r"reset prefix cache", r"Failed to load weights",
]))


def _run_demo(tmp_path: Path, sampler: str, iterations: int = 3) -> tuple[int, list[str]]:
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_grpo.demo", "--iterations", str(iterations),
         "--sampler", sampler, "--out", str(out)],
        cwd=tmp_path, env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    return proc.returncode, proc.stdout.splitlines()


def _check_console(code: int, lines: list[str], tmp_path: Path, iterations: int) -> None:
    text = "\n".join(lines)
    assert code == 0, text[-3000:]
    assert not [line for line in lines if NOISE.search(line)], text
    other = [line for line in lines if not PROGRESS.search(line)]
    # ready, start-up, time split, plot, TensorBoard, checkpoint, exported model, how to
    # score it (+ the summary's own line counts as progress: it names the reward).
    assert len(other) <= 10, other
    steps = [line for line in lines if line.startswith("iter ")]
    assert len(steps) == iterations, text
    for line in steps:
        for label in ("reward ", "acc ", "len ", "kl ", "step ", " tok/s"):
            assert label in line, line
    assert re.search(r"^start-up: \d+\.\ds from launch to the first training step", text,
                     re.MULTILINE), text
    out = tmp_path / "out"
    assert f"reward curve:   {out / 'reward_curve.png'}" in text
    assert (out / "reward_curve.png").is_file()
    assert f"TensorBoard:    tensorboard --logdir {out / 'tensorboard'}" in text
    assert re.search(rf"^checkpoint:     {re.escape(str(out / 'checkpoint'))}", text,
                     re.MULTILINE)
    assert (out / "checkpoint" / "rllib_checkpoint.json").is_file()
    assert f"exported model: {out / 'model'}" in text
    assert (out / "model" / "config.json").is_file()
    assert f"score it:       rllib-grpo eval {out / 'model'} --env rllib_grpo/Arithmetic-v0" in text


def test_demo_console_shows_progress_and_outputs_without_library_noise(tmp_path):
    code, lines = _run_demo(tmp_path, "hf")
    _check_console(code, lines, tmp_path, iterations=3)


@pytest.mark.vllm
@pytest.mark.slow
def test_demo_console_with_vllm_has_no_engine_logs(tmp_path):
    """vLLM prints an engine banner and three lines per weight reload unless quieted."""
    pytest.importorskip("vllm")
    code, lines = _run_demo(tmp_path, "vllm")
    _check_console(code, lines, tmp_path, iterations=3)
