"""A dead or dying env runner never fails or hangs a weight sync (issue 50 item 1), and
every wait of a sync has a deadline (issue 48).

Two remote env runners, on each CPU transport (``shm``; the object store; ``local`` has no
other process to lose).  Runner 2 is killed at each point of a sync: before it (dead, and
RLlib still counts it healthy), in the middle of its transfer, and after its transfer,
before it answers.  Each time the step completes within seconds, runner 1 holds the
learner's weights, the sync counts the runner it left out, and RLlib restarts runner 2,
which holds the learner's weights after the next step's sync (the restart counted too).
A runner that stalls past the deadline is named in one line with the run's stack file,
restarted and left out; a learner that stalls stops the run with the line naming it.
"""

from __future__ import annotations

import inspect
import logging
import os
import signal
import time
from functools import partial

import psutil
import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from tests.conftest import tiny_config

DROPPED = "fault_tolerance/weight_sync_dropped_receivers"
RESTARTS = "fault_tolerance/env_runner_restarts"
STEP_LIMIT_S = 30.0  # a step with a lost runner (a hang would be 300 s: the old gloo timeout)


def _learner_weights(algo) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in algo.learner_group.get_weights()[DEFAULT_MODULE_ID].items()}


def _runner_weights(runner) -> tuple[int, dict[str, torch.Tensor]]:
    return runner.worker_index, {k: v.clone() for k, v in runner.sampler.model.state_dict().items()}


def _assert_hold_the_learners_weights(algo, indices: list[int]) -> None:
    learner = _learner_weights(algo)
    held = dict(algo.env_runner_group.foreach_env_runner(
        _runner_weights, local_env_runner=False, remote_worker_ids=indices))
    assert sorted(held) == sorted(indices)
    for index in indices:
        assert set(held[index]) >= set(learner)
        assert all(torch.equal(held[index][k], v) for k, v in learner.items()), index


def _pid(runner) -> int:
    return os.getpid()


def _kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"pid {pid} still alive"
        time.sleep(0.05)


def _die_after_first_tensor(copy, weights) -> None:
    """The sampler's in-place copy: one tensor, then the process dies (mid-transfer)."""
    copy(iter([next(iter(weights))]))
    os._exit(1)


def _die(*_args, **_kwargs) -> None:
    os._exit(1)


def _during_transfer(runner) -> None:
    runner.sampler._copy_into_model = partial(_die_after_first_tensor,
                                              runner.sampler._copy_into_model)


def _after_transfer(runner) -> None:
    """The weights are in; the runner dies before its sync call answers."""
    runner.weights_received = _die


def _stall_transfer(seconds: float, runner) -> None:
    def stalled(weights) -> None:
        time.sleep(seconds)  # the stalled transfer

    runner.sampler._copy_into_model = stalled


def _stalled_call(seconds: float, call):
    def stalled(*args, **kwargs):
        time.sleep(seconds)  # the stalled learner
        return call(*args, **kwargs)

    return stalled


def _line_of(function, marker: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if marker in line)


# The object store's variants are slow-marked for the default suite's time (each build of
# two runners takes ~25 s here): `make test-slow` runs them.
@pytest.fixture(scope="class", params=["shm", pytest.param("object_store", marks=pytest.mark.slow)])
def algo(request, ray_session):
    config = tiny_config(lr=1e-2, weight_sync_transport=request.param)
    config.env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
    algo = config.build_algo()
    try:
        algo.train()
        yield algo
    finally:
        algo.stop()


def _both_runners_in_service(algo, within_s: float = 45.0) -> dict:
    """Train until runners 1 and 2 are in service (Ray restarts a dead one's process; at
    the start of a step RLlib pings it and brings it back: `restore_env_runners`)."""
    deadline = time.monotonic() + within_s
    while True:
        result = algo.train()
        if sorted(algo.env_runner_group.healthy_worker_ids()) == [1, 2]:
            return result
        assert time.monotonic() < deadline, (
            f"env runners in service: {algo.env_runner_group.healthy_worker_ids()}")
        time.sleep(0.5)


class TestARunnerKilledDuringASync:
    @pytest.mark.parametrize("when", ["before", "during", "after"])
    def test_the_sync_completes_for_the_live_runner_and_the_dead_one_rejoins(
            self, algo, when, monkeypatch, caplog):
        _both_runners_in_service(algo)
        transport = algo.config.weight_sync_transport
        assert algo._weight_sync.transport_names() == {1: transport, 2: transport}
        group = algo.env_runner_group
        pids = dict(group.foreach_env_runner(lambda er: (er.worker_index, os.getpid()),
                                             local_env_runner=False))
        before = algo.train()
        if when == "before":  # after this step's sample and update, as the sync starts
            sync = algo._weight_sync.sync
            monkeypatch.setattr(algo._weight_sync, "sync", lambda: (_kill(pids[2]), sync())[1])
        else:
            group.foreach_env_runner(_during_transfer if when == "during" else _after_transfer,
                                     local_env_runner=False, remote_worker_ids=[2])
        start = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="rllib_grpo.rllib.algorithm.weight_sync"):
            result = algo.train()
        assert time.monotonic() - start < STEP_LIMIT_S
        monkeypatch.undo()
        assert result[DROPPED] == before[DROPPED] + 1
        (line,) = [r.getMessage() for r in caplog.records if "weight sync: env runner" in
                   r.getMessage()]
        assert line.startswith("weight sync: env runner 2 (node ") and f"pid {pids[2]})" in line
        assert " died during '" in line
        _assert_hold_the_learners_weights(algo, [1])
        # RLlib restarts runner 2; it gets the current weights and joins the next sync.
        result = _both_runners_in_service(algo)
        assert result[RESTARTS] >= before[RESTARTS] + 1
        algo.train()  # a sync with both again
        new_pid = dict(group.foreach_env_runner(lambda er: (er.worker_index, os.getpid()),
                                                local_env_runner=False))[2]
        assert new_pid != pids[2]
        assert algo._weight_sync.transport_names() == {1: transport, 2: transport}
        _assert_hold_the_learners_weights(algo, [1, 2])

    def test_a_runner_past_its_deadline_is_restarted_and_left_out(self, algo, caplog):
        """A receiver that stalls: named with the run's stack file and restarted
        (`restart_stuck_runners`), the sync completes for the other runner, and the
        restarted one gets the current weights."""
        _both_runners_in_service(algo)
        deadlines, floor = algo.deadlines, algo.deadlines.floor_s
        deadlines.floor_s = 3.0  # the sync's phases have medians of milliseconds by now
        group = algo.env_runner_group
        pid = dict(group.foreach_env_runner(lambda er: (er.worker_index, os.getpid()),
                                            local_env_runner=False))[2]
        before = algo.train()
        group.foreach_env_runner(partial(_stall_transfer, 60.0), local_env_runner=False,
                                 remote_worker_ids=[2])
        start = time.monotonic()
        try:
            with caplog.at_level(logging.WARNING, logger="rllib_grpo.rllib.algorithm"):
                result = algo.train()
        finally:
            deadlines.floor_s = floor
        assert time.monotonic() - start < STEP_LIMIT_S
        phase = "read" if algo.config.weight_sync_transport == "shm" else "object store load"
        (line,) = [r.getMessage() for r in caplog.records
                   if r.getMessage().startswith("env runner 2 did not finish")]
        assert line.startswith(f"env runner 2 did not finish the weight sync's '{phase}' "
                               "within 3 s (step_timeout_floor_s")
        assert "restarting, the sync went on without it" in line
        assert f"pid {pid} on node" in line
        stack_file = line.rsplit("Python stacks of every process of the run: ", 1)[1]
        stuck = _line_of(_stall_transfer, "the stalled transfer")
        assert f'File "{__file__}", line {stuck} in stalled' in open(stack_file).read()
        assert result[DROPPED] == before[DROPPED] + 1
        assert result["fault_tolerance/env_runner_hangs"] == before[
            "fault_tolerance/env_runner_hangs"] + 1
        _assert_hold_the_learners_weights(algo, [1])
        _both_runners_in_service(algo)
        algo.train()
        _assert_hold_the_learners_weights(algo, [1, 2])

    def test_a_learner_past_its_deadline_stops_the_run_naming_it(self, algo, monkeypatch):
        from rllib_grpo.rllib.algorithm.deadlines import HangError

        phase = "write" if algo.config.weight_sync_transport == "shm" else "object store put"
        sender = algo.learner_group._learner.weight_sender
        if phase == "write":
            monkeypatch.setattr(sender, "offer_shared", _stalled_call(30, sender.offer_shared))
        else:  # the object store's call reads the version last
            monkeypatch.setattr(type(sender), "seq_no",
                                property(_stalled_call(30, lambda self: 0)))
        deadlines, floor = algo.deadlines, algo.deadlines.floor_s
        deadlines.floor_s = 2.0
        start = time.monotonic()
        try:
            with pytest.raises(HangError, match=rf"the local learner \(weight sync: {phase}\) "
                                                r"did not finish within 2.0 s") as stopped:
                algo.train()
        finally:
            deadlines.floor_s = floor
        assert time.monotonic() - start < STEP_LIMIT_S
        stack_file = str(stopped.value).rsplit("of every process of the run: ", 1)[1]
        stuck = _line_of(_stalled_call, "the stalled learner")
        assert f'File "{__file__}", line {stuck} in stalled' in open(stack_file).read()
