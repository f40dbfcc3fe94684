"""Reward calls run in parallel with a per-call timeout that really ends a hung call;
a score that overflows float32 is an error-scored sample; a run that learns nothing stops."""

from __future__ import annotations

import functools
import os
import time

import psutil
import pytest

from rllib_grpo.rewards import RewardScorer, score_arithmetic
from rllib_grpo.rewards.pool import declare_isolation, declared_isolation, default_reward_workers
from tests.conftest import tiny_config


def hang(data_source, solution_str, ground_truth, extra_info=None):
    (extra_info["dir"] / str(os.getpid())).touch()
    time.sleep(600)
    return 1.0


def open_fds(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 0.0, "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))}


def echo(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "boom":
        raise KeyError("boom")
    return {"score": float(solution_str), "pid": os.getpid()}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sixteen_hanging_rewards_cost_one_timeout_and_are_killed(tmp_path):
    scorer = RewardScorer(hang, timeout_s=1.0, workers=16)
    assert scorer.pool.mode == "process"  # user code
    start = time.perf_counter()
    results = scorer.score_many([("any", str(i), "x", {"dir": tmp_path}) for i in range(16)])
    elapsed = time.perf_counter() - start
    assert elapsed < 4.0, elapsed  # one 1 s timeout for all sixteen, not sixteen in a row
    assert all(r["reward_error"] and "TimeoutError" in r["reward_error_message"]
               for r in results)
    assert (scorer.num_calls, scorer.num_timeouts, scorer.pool.num_killed) == (16, 16, 16)
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 16 and not any(map(_alive, pids))  # the hung processes are gone
    scorer.close()


def test_calls_run_in_parallel_in_order_and_survive_errors():
    scorer = RewardScorer(echo, timeout_s=5.0, workers=4)
    requests = [("any", str(i), "x", None) for i in range(12)] + [("any", "boom", "x", None)]
    results = scorer.score_many(requests)
    assert [r["score"] for r in results[:12]] == [float(i) for i in range(12)]
    assert len({r["pid"] for r in results[:12]} - {os.getpid()}) > 1  # several workers
    assert results[12]["reward_error"] and "KeyError" in results[12]["reward_error_message"]
    assert scorer.num_errors == 1
    pids = {r["pid"] for r in results[:12]}
    scorer.close()
    assert not any(map(_alive, pids))


def test_a_worker_process_holds_none_of_its_parents_files(tmp_path):
    with open(tmp_path / "held_open", "w"):  # a descriptor of the parent's
        scorer = RewardScorer(open_fds, timeout_s=5.0)
        fds = scorer("any", "x", "y")["fds"]
    scorer.close()
    # stdin/stdout/stderr, its pipe, and the descriptor listdir used
    assert len(fds) <= 5 and fds[:3] == [0, 1, 2], fds


def test_builtin_scorers_run_as_declared_user_code_in_processes():
    assert RewardScorer().pool.mode == "thread"  # compute_score may dispatch to math
    assert RewardScorer("math").pool.mode == "thread"
    assert RewardScorer("gsm8k").pool.mode == "inline"  # declared: linear in the response
    assert RewardScorer("arithmetic").pool.mode == "inline"
    assert RewardScorer(score_arithmetic).pool.mode == "inline"
    assert RewardScorer(echo).pool.mode == "process"
    assert RewardScorer(echo, isolation="thread").pool.mode == "thread"
    with pytest.raises(ValueError, match="isolation"):
        RewardScorer(echo, isolation="fiber")


def test_a_user_function_may_declare_its_isolation_and_the_declaration_is_checked():
    declared = declare_isolation("inline")(lambda *args, **kwargs: 1.0)
    assert declared_isolation(declared) == "inline" == RewardScorer(declared).pool.mode
    assert declared_isolation(functools.partial(declared, "any")) == "inline"
    assert declared_isolation(echo) == "process"
    with pytest.raises(ValueError, match="isolation"):
        declare_isolation("fiber")


def _idle_pids(pool) -> list[int]:
    """Process ids of the pool's idle workers (every worker between calls)."""
    return [worker.pid for worker in pool._idle if worker.pid is not None]


def test_an_inline_builtin_scores_in_the_caller_and_starts_nothing():
    scorer = RewardScorer("arithmetic")
    results = scorer.score_many([("arithmetic", str(i), 3, None) for i in range(8)])
    assert [r["score"] for r in results] == [float(i == 3) for i in range(8)]
    assert _idle_pids(scorer.pool) == [] and scorer.pool._idle == []


def test_reward_processes_are_sized_to_the_machine_and_forked_on_first_need(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2})
    assert default_reward_workers() == 3
    scorer = RewardScorer(echo, timeout_s=5.0)
    assert scorer.pool.max_workers == 3  # not 16 on a 3-CPU process
    before = set(psutil.Process().children())
    assert _idle_pids(scorer.pool) == []  # none before a call needs one
    assert set(psutil.Process().children()) == before
    scorer.score_many([("any", "1", "x", None)])
    assert len(_idle_pids(scorer.pool)) == 1  # one call, one process
    results = scorer.score_many([("any", str(i), "x", None) for i in range(32)])
    assert [r["score"] for r in results] == [float(i) for i in range(32)]
    pids = {r["pid"] for r in results}
    assert len(pids) == 3 and set(_idle_pids(scorer.pool)) == pids  # 3 forks, reused
    scorer.close()
    assert RewardScorer(echo, workers=16).pool.max_workers == 16  # asked for: honoured


@pytest.mark.parametrize("value", [1e39, -1e39, {"score": 3.5e38}])
def test_a_score_infinite_in_float32_is_an_error_scored_sample(value):
    scorer = RewardScorer(lambda *args, **kwargs: value, isolation="inline")
    result = scorer("any", "x", "y")
    assert result["reward_error"] is True and result["score"] == 0.0
    assert "infinite in float32" in result["reward_error_message"]
    assert scorer.num_errors == 1
    assert RewardScorer(lambda *a, **k: 3.0e38, isolation="inline")("a", "x", "y")[
        "reward_error"] is False


@pytest.mark.slow
def test_a_run_whose_rewards_all_fail_stops_with_a_message(ray_session, tmp_path):
    reward_file = tmp_path / "huge_reward.py"
    # The door calls it once on an empty sample (the env has no data file) and checks the
    # score there: a finite one, so that the run's own stop on failing rewards is what runs.
    reward_file.write_text("def reward(data_source, solution_str, ground_truth, "
                           "extra_info=None):\n    return 1.0 if not data_source else 1e39\n")
    config = tiny_config(max_skipped_steps=2)
    config.env_config = {"max_operand": 4, "reward_fn": f"{reward_file}:reward"}
    algo = config.build_algo()
    try:
        first = algo.train()
        assert first["reward/errors"] == 16  # every sample error-scored, counted
        with pytest.raises(Exception, match=r"2 training steps in a row learned nothing: every "
                                            r"reward call failed \(e\.g\. ValueError: reward "
                                            r"score 1e\+39 is infinite in float32"):
            algo.train()
    finally:
        algo.stop()
