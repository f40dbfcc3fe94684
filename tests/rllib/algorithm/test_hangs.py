"""No silent hangs (docs/hangs.md): each hang injected through the package's own seams (an
env runner or learner subclass, a reward actor), each run named and stopped or recovered
within its deadline, each report one line whose stack file holds the stuck frame."""

from __future__ import annotations

import inspect
import logging
import os
import re
import time
from pathlib import Path

import pytest

from tests.conftest import tiny_config
from tests.helpers.hangs import blocking_learner

STACK_FILE = r"\. Python stacks of every process of the run: (?P<file>\S+\.txt)"


def _line_of(function, marker: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if marker in line)


def _stack_file(message: str) -> str:
    match = re.search(STACK_FILE + "$", message)
    assert match, message
    assert Path(match["file"]).is_file()
    return Path(match["file"]).read_text()


# --------------------------------------------------------------------- a stuck env runner
def _blocks_once(marker: str) -> type:
    """An env runner whose sample blocks forever once the marker file exists (the first
    runner to see it takes it): its restarted copy samples as usual."""
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner

    class BlocksOnce(TextEnvRunner):
        def sample(self, **kwargs):
            try:
                os.rename(marker, marker + ".taken")
            except OSError:
                return super().sample(**kwargs)
            while True:
                time.sleep(0.1)  # the stuck sample

    return BlocksOnce


@pytest.mark.slow  # ~30 s: a runner built twice (the restart)
@pytest.mark.timeout(120)
def test_a_stuck_env_runner_is_restarted_and_its_share_sampled_again(
        ray_session, tmp_path, caplog):
    from rllib_grpo.cli.tensorboard import flatten

    marker = str(tmp_path / "block")
    runner_cls = _blocks_once(marker)
    config = tiny_config(step_timeout_floor_s=6, step_timeout_factor=3,
                         env_runner_restart_timeout_s=60)
    config.env_runners(num_env_runners=1, create_local_env_runner=False,
                       env_runner_cls=runner_cls)
    config.fault_tolerance(restart_failed_env_runners=True, env_runner_health_probe_timeout_s=10)
    algo = config.build_algo()
    try:
        first = flatten(algo.train())
        assert first["fault_tolerance/env_runner_hangs"] == 0
        Path(marker).touch()  # the next sample blocks
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="rllib_grpo.rllib.algorithm.resilience"):
            second = flatten(algo.train())
        assert time.monotonic() - t0 < 50
        assert algo.iteration == 2  # the step completed on the restarted runner
        assert second["fault_tolerance/env_runner_hangs"] == 1
        assert second["fault_tolerance/env_runner_restarts"] == 1
        assert second["fault_tolerance/resampled_shares"] == 1
        assert algo.last_rollout.num_groups == 4
        (message,) = [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
        print(message)  # (shown with -s: the line a user sees)
        assert re.fullmatch(
            r"env runner 1 did not finish sampling within 6 s \(step_timeout_floor_s; 3 x the "
            r"median \S+ s of this wait is less\): restarting, its share is sampled again; "
            r"env runner 1 \(BlocksOnce\), pid \d+ on node \S+ \(\w+\)" + STACK_FILE, message)
        text = _stack_file(message)
        assert "=== waited on: env runner 1 (BlocksOnce), pid " in text
        stuck = _line_of(runner_cls.sample, "the stuck sample")
        assert f'File "{__file__}", line {stuck} in sample' in text
    finally:
        algo.stop()


@pytest.mark.timeout(120)
def test_a_learner_stuck_in_its_update_stops_the_run(ray_session):
    from rllib_grpo.rllib.algorithm.deadlines import HangError

    learner_cls = blocking_learner(2)
    # (A floor that the sampling and the first update meet on a busy 2-core machine.)
    config = tiny_config(step_timeout_floor_s=6, step_timeout_factor=3)
    config.learners(num_learners=1, learner_class=learner_cls)
    algo = config.build_algo()
    try:
        algo.train()
        t0 = time.monotonic()
        with pytest.raises(HangError) as error:
            algo.train()
        assert time.monotonic() - t0 < 30
        message = str(error.value)
        print(message)  # (shown with -s: the line a user sees)
        assert re.fullmatch(
            r"learner 0 \(update\) did not finish within 6\.0 s \(step_timeout_floor_s; 3 x "
            r"the median \S+ s of this wait is less\); learner 0 \(BlocksInUpdate\), pid \d+ "
            r"on node \S+ \(\w+\)" + STACK_FILE, message), message
        text = _stack_file(message)
        assert "=== waited on: learner 0 (BlocksInUpdate), pid " in text
        blocking = _line_of(learner_cls.update, "the blocking line")
        assert f'File "{inspect.getsourcefile(blocking_learner)}", line {blocking} in update' in text
    finally:
        algo.stop()


# --------------------------------------------------------------------- start-up
def _starts_a_sandbox() -> type:
    """An env runner that starts a sandbox actor asking for more CPUs than the cluster has,
    and waits for it in its constructor."""
    import ray

    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner

    class Sandbox:
        def ready(self) -> bool:
            return True

    class StartsASandbox(TextEnvRunner):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            sandbox = ray.remote(num_cpus=8)(Sandbox).remote()
            ray.get(sandbox.ready.remote())  # waits for a placement that never comes

    return StartsASandbox


@pytest.mark.slow  # ~25 s: the start-up deadline itself
@pytest.mark.timeout(120)
def test_an_actor_never_placed_is_named_within_the_startup_deadline(ray_session):
    from rllib_grpo.rllib.algorithm.deadlines import HangError

    runner_cls = _starts_a_sandbox()
    config = tiny_config(startup_timeout_s=25)
    config.env_runners(num_env_runners=1, create_local_env_runner=False,
                       env_runner_cls=runner_cls)
    t0 = time.monotonic()
    with pytest.raises(HangError) as error:
        config.build_algo()
    assert time.monotonic() - t0 < 45
    message = str(error.value)
    print(message)  # (shown with -s: the line a user sees)
    assert re.fullmatch(
        r"the run's start-up did not finish within 25 s \(startup_timeout_s\); "
        r"env runner 1 \(StartsASandbox\), pid \d+ on node \S+ \(\w+\), actor \w{8}, still in "
        r"its constructor; Sandbox \(actor \w{8}\) was never placed: "
        r"needs 8 CPU \(the cluster has 2 in all, [\d.]+ free\)" + STACK_FILE, message), message
    text = _stack_file(message)
    assert "=== waited on: env runner 1 (StartsASandbox), pid " in text
    waiting = _line_of(runner_cls.__init__, "waits for a placement")
    assert f'File "{__file__}", line {waiting} in __init__' in text


# --------------------------------------------------------------------- a reward actor
class SilentRewardActor:
    """A reward actor (registered as the run's, as `RewardWorker` does) that never answers."""

    def __init__(self, run_id: str) -> None:
        from rllib_grpo.rllib.stacks import enable_stack_dumps

        enable_stack_dumps(run_id, "reward worker rm[0] (SilentRewardActor)")

    def ready(self) -> int:
        return os.getpid()

    def score(self, prompts, responses, ground_truths):
        while True:
            time.sleep(0.1)  # never answers


@pytest.mark.timeout(120)
def test_a_reward_actor_that_never_answers_is_bounded_and_named(ray_session, tmp_path):
    """An env runner's reward mixture scoring through a reward actor that never answers:
    the batch scores 0 after reward_model_timeout_s, its error names the actor, and the
    stack file in the runner's log folder holds the actor's stuck frame."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.rllib.config.reward_plan import REWARD_ACTOR_PREFIX, actor_names, actor_specs
    from rllib_grpo.rllib.config.text_env import make_text_env
    from rllib_grpo.rllib.env_runner.rewards import install_reward_mixture
    from rllib_grpo.rllib.stacks import RUN_ID_ATTRIBUTE, forget_run

    run_id, prefix = "reward-hang", "rllib_grpo.rewards.hangtest"
    config = GRPOConfig().environment("rllib_grpo/Arithmetic-v0", env_config={
        "max_operand": 4}).training(reward_funcs=["builtin:tiny-rm"], reward_model_timeout_s=2)
    # What the algorithm sets on its config for its env runners (`GRPO.setup`).
    object.__setattr__(config, REWARD_ACTOR_PREFIX, prefix)
    object.__setattr__(config, RUN_ID_ATTRIBUTE, run_id)
    (name,) = actor_names(prefix, actor_specs(config)[0], 1)
    actor = ray_session.remote(SilentRewardActor).options(
        name=name, num_cpus=0, max_restarts=-1, max_task_retries=0).remote(run_id)
    ray_session.get(actor.ready.remote())
    try:
        env = make_text_env(config, None, 0, overrides={"max_prompt_length": None})
        install_reward_mixture(env, config, 0, str(tmp_path))
        _, info = env.reset()
        t0 = time.monotonic()
        (result,) = env.score_many([(info["index"], "x")])
        assert time.monotonic() - t0 < 20
        assert result["score"] == 0.0 and result["reward_error"]
        message = result["reward_error_message"]
        print(message)  # (shown with -s: the line a user sees)
        assert re.fullmatch(
            r"reward 'builtin_tiny-rm': TimeoutError: reward actor " + re.escape(name)
            + r" did not answer within 2 s for 1 samples \(reward_model_timeout_s\): "
            r"restarted, the batch scored 0; reward actor \S+ is reward worker rm\[0\] "
            r"\(SilentRewardActor\), pid \d+ on node \S+ \(\w+\)" + STACK_FILE, message), message
        text = _stack_file(message)
        assert Path(re.search(STACK_FILE, message)["file"]).parent == tmp_path
        assert "=== waited on: reward worker rm[0] (SilentRewardActor), pid " in text
        silent = _line_of(SilentRewardActor.score, "never answers")
        assert f'File "{__file__}", line {silent} in score' in text
    finally:
        ray_session.kill(actor, no_restart=True)
        forget_run(run_id)
