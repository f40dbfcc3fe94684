"""A remote env runner killed (SIGKILL) in the middle of sampling: the step completes on the
runner Ray restarts, which first gets the current weights and its data position."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import tiny_config

KILLER = '''
import os, signal, time
from rllib_grpo.rewards import compute_score

MARKER = {marker!r}


def reward(data_source, solution_str, ground_truth, extra_info=None):
    """Kill the env runner whose pid is in MARKER, once (the first caller takes the file)."""
    try:
        os.rename(MARKER, MARKER + ".taken")
    except OSError:
        return compute_score(data_source, solution_str, ground_truth, extra_info)
    with open(MARKER + ".taken") as f:
        os.kill(int(f.read()), signal.SIGKILL)
    time.sleep(60)
'''


def _algo_with_a_killer_reward(tmp_path, **training):
    """One remote env runner on 64 sums whose reward kills the runner whose pid is written
    to the returned marker file (once); Ray restarts it."""
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "answer": str(a + b)}) + "\n"
                            for a in range(8) for b in range(8)))
    marker = tmp_path / "kill_runner"
    (tmp_path / "killer.py").write_text(KILLER.format(marker=str(marker)))
    config = tiny_config(lr=1e-2, env_runner_restart_timeout_s=300, **training)
    config.environment("rllib_grpo/GSM8K-v0")
    config.env_config = {"path": str(data), "data_source": "arithmetic",
                         "reward_fn": f"{tmp_path / 'killer.py'}:reward"}
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    config.fault_tolerance(restart_failed_env_runners=True, env_runner_health_probe_timeout_s=10)
    return config.build_algo(), marker


def _runner_pid(algo) -> int:
    return algo.env_runner_group.foreach_env_runner(
        lambda er: os.getpid(), local_env_runner=False)[0]


@pytest.mark.slow
def test_a_killed_env_runner_is_restarted_with_current_weights_and_data_position(
        ray_session, tmp_path):
    from rllib_grpo.cli.tensorboard import flatten

    algo, marker = _algo_with_a_killer_reward(tmp_path)
    try:
        first_pid = _runner_pid(algo)
        results = [flatten(algo.train())]
        marker.write_text(str(first_pid))  # the next sample's first reward call kills it
        results += [flatten(algo.train()) for _ in range(3)]
        assert algo.iteration == 4  # every step completed
        assert marker.with_suffix(".taken").exists() and _runner_pid(algo) != first_pid
        assert results[1]["fault_tolerance/env_runner_restarts"] == 1
        assert results[-1]["fault_tolerance/env_runner_restarts"] == 1
        # The restarted runner sampled with the learner's current weights ...
        assert max(r["training/rollout_probs_diff_max"] for r in results) < 1e-5
        # ... and continued its data where it stood: 4 steps x 4 prompts, none served twice.
        (state,) = algo.env_runner_group.foreach_env_runner(
            lambda er: er.env.get_state(), local_env_runner=False)
        assert (state["epoch"], state["position"]) == (0, 16)
    finally:
        algo.stop()


@pytest.mark.slow
def test_a_runner_killed_during_a_background_request_costs_a_resampled_share(
        ray_session, tmp_path):
    """``max_staleness=1``: the runner dies while it samples the next step's groups in the
    background; the step that takes them samples the lost share again (at the same
    positions of the prompt order) on the runner Ray restarts, and no trained group is
    older than the bound."""
    from rllib_grpo.cli.tensorboard import flatten

    algo, marker = _algo_with_a_killer_reward(tmp_path, max_staleness=1, rollout_is="token")
    try:
        first_pid = _runner_pid(algo)
        results = [flatten(algo.train())]
        # From step 2 on a runner samples only in background requests (launched before
        # each update): the first reward call from now on kills it inside one.
        marker.write_text(str(first_pid))
        results += [flatten(algo.train()) for _ in range(3)]
        assert algo.iteration == 4  # every step completed
        assert marker.with_suffix(".taken").exists() and _runner_pid(algo) != first_pid
        assert results[0]["fault_tolerance/env_runner_restarts"] == 0
        assert results[-1]["fault_tolerance/env_runner_restarts"] == 1
        assert results[-1]["fault_tolerance/resampled_shares"] == 1
        assert max(r["async/staleness_max"] for r in results) <= 1
        # 4 steps trained + 1 in flight, 4 prompts each: the order went on where it stood.
        assert algo.prompt_order.position == 20
        (state,) = algo.env_runner_group.foreach_env_runner(
            lambda er: er.env.get_state(), local_env_runner=False)
        assert state["position"] in (16, 20)  # the in-flight request may still be sampling
        assert algo.last_rollout.num_groups == 4
    finally:
        algo.stop()
