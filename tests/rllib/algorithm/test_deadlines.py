"""`Deadlines` in one process (no Ray): a step's wait gets the floor until its phase has a
median, then a multiple of it; a wait in the main thread past its deadline is interrupted
and becomes `HangError`, whose one line names the wait and the stack file holding its
frame."""

from __future__ import annotations

import inspect
import re
import time
import uuid
from pathlib import Path

import pytest

from rllib_grpo.rllib.algorithm.deadlines import Deadlines, HangError, label_range


def _deadlines(tmp_path: Path, **kwargs) -> Deadlines:
    return Deadlines(uuid.uuid4().hex[:12], folder=lambda: tmp_path, **{
        "factor": 10.0, "floor_s": 60.0, **kwargs})


def test_a_phase_gets_the_floor_then_a_multiple_of_its_median(tmp_path):
    deadlines = _deadlines(tmp_path)
    try:
        assert deadlines.timeout_and_rule("sample") == (
            60.0, "step_timeout_floor_s, for the first sample of the run")
        for seconds in (2.0, 9.0, 8.0):
            deadlines.record("sample", seconds)
        assert deadlines.timeout_and_rule("sample") == (
            80.0, "step_timeout_factor 10 x the median 8.0 s of this wait")
        deadlines.record("update", 1.0)  # 10 x 1 s < the floor
        assert deadlines.timeout_for("update") == 60.0
        with deadlines.watch("update", "the local learner (update)"):
            pass
        assert deadlines.timeout_for("update") == 60.0
        assert len(deadlines._durations["update"]) == 2  # a wait that ended in time counts
    finally:
        deadlines.close()


def test_an_error_inside_a_wait_that_did_not_expire_is_not_a_hang(tmp_path):
    deadlines = _deadlines(tmp_path)
    try:
        with pytest.raises(ValueError, match="the step's own"), \
                deadlines.watch("sample", "the local env runner (sampling)"):
            raise ValueError("the step's own")
        assert "sample" not in deadlines._durations  # a failed wait sets no median
    finally:
        deadlines.close()


def _block_in_update() -> None:
    time.sleep(3600)  # the blocking line


def test_a_wait_in_this_process_past_its_deadline_stops_with_one_line(tmp_path):
    deadlines = _deadlines(tmp_path, floor_s=1.0)
    t0 = time.monotonic()
    try:
        with pytest.raises(HangError) as error, \
                deadlines.watch("update", "the local learner (update)", kill=False):
            _block_in_update()
    finally:
        deadlines.close()
    assert time.monotonic() - t0 < 15
    message = str(error.value)
    assert "\n" not in message
    match = re.fullmatch(
        r"the local learner \(update\) did not finish within 1\.0 s \(step_timeout_floor_s, "
        r"for the first update of the run\)\. Python stacks of every process of the run: "
        r"(\S+stacks-\S+\.txt)", message)
    assert match, message
    stack_file = Path(match[1])
    assert stack_file.parent == tmp_path
    lines, first = inspect.getsourcelines(_block_in_update)
    blocking = first + next(i for i, line in enumerate(lines) if "the blocking line" in line)
    text = stack_file.read_text()
    assert text.startswith(message.split(". Python stacks")[0])
    assert f'File "{__file__}", line {blocking} in _block_in_update' in text
    assert "=== algorithm (driver), pid " in text


def test_labels_name_runners_and_learners():
    assert label_range("env runner", [2]) == "env runner 2"
    assert label_range("env runner", [3, 1]) == "env runners 1, 3"
    assert label_range("learner", [0, 1, 2, 3]) == "learners 0-3"
