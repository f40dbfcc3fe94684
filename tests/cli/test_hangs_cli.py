"""`rllib train` and hangs: a learner stuck in its update ends the run with a non-zero exit
and the one-line cause; a trial whose placement group Ray cannot place is named within the
start-up deadline; the progress printer shows a wait that lasts longer than usual."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT, tiny_config
from tests.helpers.cli_runs import ENV, RAY_LIMITS, TINY
from tests.helpers.hangs import blocking_learner

# A GRPO whose learner blocks in its second update (`blocking_learner`), run by `rllib
# train` as any algorithm Tune knows by name.
DRIVER = '''
import sys

from ray.tune.registry import register_trainable

from rllib_grpo.cli.main import main
from rllib_grpo.rllib.algorithm.grpo import GRPO
from tests.helpers.hangs import blocking_learner


class GRPOWithAStuckLearner(GRPO):
    @classmethod
    def get_default_config(cls):
        return super().get_default_config().learners(
            num_learners=1, learner_class=blocking_learner(2))


register_trainable("GRPOWithAStuckLearner", GRPOWithAStuckLearner)
sys.exit(main(["train", *sys.argv[1:]]))
'''


@pytest.mark.slow  # ~40 s: rllib train starts its own Ray and Tune
@pytest.mark.timeout(180)
def test_rllib_train_stops_on_a_stuck_learner_with_a_non_zero_exit(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    # (A floor that the sampling and the first update meet on a busy 2-core machine.)
    settings = {**TINY, "step_timeout_floor_s": 8, "step_timeout_factor": 3}
    run = subprocess.run(
        [sys.executable, str(script), "--algo", "GRPOWithAStuckLearner", "--env", ENV,
         "--config", json.dumps(settings), "--stop", '{"training_iteration": 3}',
         "--max-failures", "0", "--storage-path", str(tmp_path / "runs"), *RAY_LIMITS],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=170,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "RAY_DEDUP_LOGS": "0"})
    out = run.stdout + run.stderr
    assert run.returncode == 1, out[-4000:]
    assert re.search(r"^iter 1 ", run.stdout, re.MULTILINE), out[-4000:]
    failed = [line for line in out.splitlines() if line.startswith("trial ")
              and " failed: " in line]
    assert len(failed) == 1, out[-4000:]
    print(failed[0])  # (shown with -s: the line a user sees)
    match = re.fullmatch(
        r"trial \S+ failed: HangError: learner 0 \(update\) did not finish within 8\.0 s "
        r"\(step_timeout_floor_s; 3 x the median \S+ s of this wait is less\); learner 0 "
        r"\(BlocksInUpdate\), pid \d+ on node \S+ \(\w+\)\. Python stacks of every process of "
        r"the run: (\S+\.txt)", failed[0])
    assert match, failed[0]
    stack_file = Path(match[1])
    assert stack_file.parent.parent == tmp_path / "runs" / stack_file.parent.parent.name
    text = stack_file.read_text()
    assert "=== waited on: learner 0 (BlocksInUpdate), pid " in text
    source = Path(sys.modules[blocking_learner.__module__].__file__)
    blocking = next(n for n, line in enumerate(source.read_text().splitlines(), start=1)
                    if "the blocking line" in line)
    assert f'File "{source}", line {blocking} in update' in text


@pytest.mark.timeout(120)
def test_a_trial_ray_cannot_place_is_named_within_the_startup_deadline(ray_session, tmp_path):
    from ray import tune

    from rllib_grpo.cli.tune import TrialStartDeadline
    from rllib_grpo.rllib.algorithm.deadlines import HangError
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    # An env runner that asks for a resource this cluster lacks: a joined cluster (where
    # `rllib train` does not check the trial before Tune) might have it, or grow it.
    config = tiny_config()
    config.env_runners(num_env_runners=1, create_local_env_runner=False,
                       custom_resources_per_env_runner={"sandbox_host": 1})
    t0 = time.monotonic()
    with pytest.raises(HangError) as error:
        tune.Tuner(GRPO, param_space=config, run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="unplaceable", verbose=0,
            stop={"training_iteration": 1},
            callbacks=[TrialStartDeadline(timeout_s=5)])).fit()
    assert time.monotonic() - t0 < 45
    message = str(error.value)
    print(message)  # (shown with -s: the line a user sees)
    match = re.fullmatch(
        r"trial GRPO_\S+ did not start within 5 s \(startup_timeout_s\): its placement group "
        r"\(\{CPU: 1\}, \{CPU: 1, sandbox_host: 1\}\) is not placed: env runner 1 needs 1 CPU, "
        r"1 sandbox_host on one node, but once the run's larger bundles are placed the "
        r"cluster's nodes have left: [\d.]+ CPU, 0 sandbox_host\. Free those resources, grow "
        r"the cluster, or make the trial smaller \(num_env_runners, num_learners, "
        r"num_reward_workers, their GPUs and custom resources\)\. Python stacks of the Tune "
        r"driver: (\S+\.txt)", message)
    assert match, message
    stack_file = Path(match[1])
    assert stack_file.parent == tmp_path / "unplaceable"
    assert "in on_step_end" in stack_file.read_text()  # the Tune loop that waited


def test_the_progress_printer_shows_a_wait_longer_than_usual(ray_session, monkeypatch,
                                                             capsys, tmp_path):
    from types import SimpleNamespace

    from rllib_grpo.cli import tune as cli_tune
    from rllib_grpo.rllib.algorithm import deadlines as deadlines_module
    from rllib_grpo.rllib.algorithm.deadlines import Deadlines

    monkeypatch.setattr(deadlines_module, "STATUS_AFTER_S", 0.5)
    deadlines = Deadlines("progress-test", factor=10, floor_s=60, folder=lambda: tmp_path,
                          trial_id="trial_1")
    printer = cli_tune.ProgressPrinter()
    trial = SimpleNamespace(trial_id="trial_1", status="RUNNING")
    try:
        with deadlines.watch("sample", "env runner 2 (sampling)"):
            time.sleep(2.2)
            printer.on_step_end(1, [trial])
            printer.on_step_end(2, [trial])  # polled again at once: nothing new
        assert re.fullmatch(r"waiting on env runner 2 \(sampling\) [23] s\n",
                            capsys.readouterr().out)
        printer._next_poll = 0.0
        printer.on_step_end(3, [trial])  # the wait ended: nothing
        assert capsys.readouterr().out == ""
    finally:
        deadlines.close()
