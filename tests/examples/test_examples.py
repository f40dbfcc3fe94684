"""The examples run as written (tiny model, few iterations)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

# Each example trains: its own Ray in a subprocess.
pytestmark = pytest.mark.ray

ROOT = REPO_ROOT


def _run(args: list[str]) -> str:
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


# In `make test-slow` only: its calls (build_algo, train, save_to_path, GRPO.from_checkpoint,
# train) run in the default suite in tests/rllib/algorithm/test_grpo_e2e.py
# (test_checkpoint_round_trip_continues_identically, which also checks the restored run
# continues identically) and explain()'s lines in tests/rllib/config/test_explain.py.
@pytest.mark.slow
def test_python_api_example(tmp_path):
    out = _run(["examples/python_api.py", "--iterations", "2", "--model", "builtin:tiny",
                "--sampler", "hf", "--out", str(tmp_path / "ckpt")])
    assert "trajectories per step:         128" in out
    assert "iter   2" in out and "restored at iteration 2" in out


def test_tune_sweep_example_runs_two_trials(tmp_path):
    out = _run(["examples/tune_sweep.py", "--iterations", "2", "--model", "builtin:tiny",
                "--storage-path", str(tmp_path)])
    trials = [line for line in out.splitlines() if line.startswith("lr=")]
    assert len(trials) == 2
    assert "group_size=4" in trials[0] and "group_size=8" in trials[1]
    for line in trials:
        assert Path(line.split("checkpoint ")[1]).is_dir()


def test_own_data_example_trains_on_a_jsonl_file_with_a_reward_file():
    out = _run(["examples/own_data.py", "--iterations", "2", "--model", "builtin:demo",
                "--sampler", "hf"])
    lines = [line for line in out.splitlines() if line.startswith("iter ")]
    assert [line.split()[1] for line in lines] == ["1", "2"]
    rewards = [float(line.split("reward ")[1]) for line in lines]
    assert all(0.0 <= r <= 1.0 for r in rewards)
    assert max(rewards) > 0.0  # the reward file is called and sometimes says "right"
