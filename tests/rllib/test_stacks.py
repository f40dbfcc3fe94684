"""`rllib_grpo.rllib.stacks`: the stacks of a run's processes, taken while they are stuck,
and what Ray's actor table tells of an actor that was never placed."""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import pytest

from tests.helpers.stuck_worker import StuckWorker


def _stuck_line() -> int:
    lines, first = inspect.getsourcelines(StuckWorker.wait_forever)
    return first + next(i for i, line in enumerate(lines) if "the stuck frame" in line)


@pytest.mark.timeout(120)
def test_the_stack_file_holds_the_stuck_frame_of_a_blocked_actor(ray_session, tmp_path):
    import psutil

    from rllib_grpo.rllib import stacks

    run_id = uuid.uuid4().hex[:12]
    actor = ray_session.remote(StuckWorker).options(num_cpus=0).remote(run_id)
    child = ray_session.get(actor.child_pid.remote())
    actor.wait_forever.remote()  # the actor's only thread is stuck from now on
    stacks.enable_stack_dumps(run_id, "algorithm (driver)")
    try:
        time.sleep(1.0)
        path = stacks.dump_stacks(run_id, tmp_path / "stacks.txt", "the header line")
        text = path.read_text()
        assert text.startswith("the header line\n")
        assert "Python stacks of the 2 processes of run" in text
        assert "=== reward worker rm[0] (StuckWorker), pid " in text
        assert "=== algorithm (driver), pid " in text
        assert f'File "{inspect.getsourcefile(StuckWorker)}", line {_stuck_line()} in wait_forever' in text
        assert f"--- child process {child}: " in text and "time.sleep(300)" in text
        assert psutil.Process(child).status() != psutil.STATUS_ZOMBIE  # never signalled
    finally:
        ray_session.kill(actor)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        stacks.forget_run(run_id)


@pytest.mark.timeout(120)
def test_an_actor_never_placed_is_named_with_what_its_bundle_has_free(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rllib_grpo.rllib import stacks

    group = placement_group([{"CPU": 0.5}, {"CPU": 0.5}])
    ray_session.get(group.ready(), timeout=60)

    class RewardModelWorker:
        def ready(self) -> bool:
            return True

    in_bundle_1 = ray_session.remote(RewardModelWorker).options(
        num_cpus=0.5, scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=1))
    try:
        first = in_bundle_1.remote()
        ray_session.get(first.ready.remote(), timeout=60)
        actor = in_bundle_1.remote()  # bundle 1 is full: never placed
        actor_id = actor._actor_id.hex()
        for _ in range(50):
            record = stacks.actor_table().get(actor_id)
            if record is not None and record.state == "PENDING_CREATION":
                break
            time.sleep(0.1)
        assert record is not None and not record.placed
        names = {group.id.hex(): "the trial's placement group"}
        assert stacks.unmet_resources(record, group_names=names) == (
            "needs 0.5 CPU in bundle 1 of the trial's placement group, which has 0 CPU "
            "free there")
        (line,) = stacks.unplaced_actor_lines([record], group_names=names)
        assert line.startswith(f"{record.class_name} (actor {actor_id[:8]}) was never placed: "
                               "needs 0.5 CPU in bundle 1")
        ray_session.kill(actor)
        ray_session.kill(first)
    finally:
        remove_placement_group(group)


@pytest.mark.timeout(60)
def test_a_placement_group_never_placed_is_named_with_each_nodes_free_room(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group

    from rllib_grpo.rllib import stacks

    group = placement_group([{"CPU": 1}, {"CPU": 64}])
    try:
        job = ray_session.get_runtime_context().get_job_id()
        lines = [line for line in stacks.unplaced_group_lines(job)
                 if line.startswith(f"placement group {group.id.hex()[:8]} ")]
        assert len(lines) == 1
        assert re.fullmatch(r"placement group \w{8} \(\{CPU: 1\}, \{CPU: 64\}\) is not placed: "
                            r"bundle 1 needs 64 CPU on one node, but once the run's "
                            r"larger bundles are placed the cluster's nodes have left: "
                            r"[\d.]+ CPU", lines[0]), lines[0]
    finally:
        remove_placement_group(group)


def test_a_process_that_did_not_register_is_not_listed(tmp_path):
    from rllib_grpo.rllib import stacks

    run_id = uuid.uuid4().hex[:12]
    assert stacks.collect_node_stacks(run_id) == []
    stacks.enable_stack_dumps(run_id, "the local learner (GRPOLearner)")
    try:
        (card,) = stacks.collect_node_stacks(run_id)
        assert card["pid"] == os.getpid() and card["roles"] == ["the local learner (GRPOLearner)"]
        assert "test_a_process_that_did_not_register_is_not_listed" in card["stacks"]
    finally:
        stacks.forget_run(run_id)
    assert stacks.collect_node_stacks(run_id) == []


@pytest.mark.slow  # ~25 s: a simulated cluster of two nodes
def test_the_stacks_of_another_nodes_processes_come_through_a_task_there():
    from tests.conftest import REPO_ROOT

    proc = subprocess.run([sys.executable, "tests/helpers/stacks_multinode_check.py"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["problems"] == []
    assert len(out["cards"]) == 2  # each process once, gathered on its own node
    by_role = {card["roles"][0]: card for card in out["cards"]}
    assert sorted(by_role) == ["algorithm (driver)", "reward worker rm[0] (StuckWorker)"]
    worker = by_role["reward worker rm[0] (StuckWorker)"]
    assert worker["node_id"] != out["driver_node"]
    assert by_role["algorithm (driver)"]["node_id"] == out["driver_node"]
    assert f"line {_stuck_line()} in wait_forever" in worker["stacks"]
