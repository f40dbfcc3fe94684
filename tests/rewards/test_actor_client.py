"""`ActorPoolReward` on real Ray actors: one call per batch, a dying actor restarted and its
batch scored again, a hung call timed out and counted."""

from __future__ import annotations

import os
import time

import pytest

from rllib_grpo.rewards.actor_client import ActorPoolReward


class FakeRewardActor:
    """A reward actor whose behaviour a test chooses: it records every call in a file (so
    calls survive restarts), may exit on the first call, or hang."""

    def __init__(self, log: str, mode: str = "ok") -> None:
        self.log, self.mode = log, mode

    def ready(self) -> int:
        return os.getpid()

    def score(self, prompts, responses, ground_truths):
        with open(self.log, "a") as f:
            f.write(f"{len(responses)}\n")
        calls = len(open(self.log).read().split())
        if self.mode == "die_once" and calls == 1:
            os._exit(1)  # the process dies mid-call
        if self.mode == "hang":
            time.sleep(60)
        return [float(len(r)) for r in responses]


def _start(ray, name, tmp_path, mode):
    log = str(tmp_path / f"{name}.log")
    actor = ray.remote(FakeRewardActor).options(
        name=name, num_cpus=0, max_restarts=-1, max_task_retries=0).remote(log, mode)
    ray.get(actor.ready.remote())
    return actor, log


@pytest.mark.timeout(120)
def test_one_actor_call_per_batch_round_robin(ray_session, tmp_path):
    a, log_a = _start(ray_session, "rw30-a", tmp_path, "ok")
    b, log_b = _start(ray_session, "rw30-b", tmp_path, "ok")
    client = ActorPoolReward(["rw30-a", "rw30-b"], timeout_s=30)
    for size in (16, 8, 4):
        assert client.score_batch(["p"] * size, ["xy"] * size, [None] * size) == [2.0] * size
    assert open(log_a).read().split() == ["16", "4"]  # whole batches, never one per sample
    assert open(log_b).read().split() == ["8"]
    assert client.num_calls == 3
    for actor in (a, b):
        ray_session.kill(actor, no_restart=True)


@pytest.mark.timeout(120)
def test_an_actor_that_dies_is_restarted_and_its_batch_scored_again(ray_session, tmp_path):
    actor, log = _start(ray_session, "rw30-die", tmp_path, "die_once")
    client = ActorPoolReward(["rw30-die"], timeout_s=60)
    assert client.score_batch(["p"] * 3, ["a", "bb", "ccc"], [None] * 3) == [1.0, 2.0, 3.0]
    assert client.num_actor_deaths == 1
    assert open(log).read().split() == ["3", "3"]  # the same batch, twice
    ray_session.kill(actor, no_restart=True)


@pytest.mark.timeout(120)
def test_a_hung_call_times_out_counts_and_the_actor_is_restarted(ray_session, tmp_path):
    actor, log = _start(ray_session, "rw30-hang", tmp_path, "hang")
    client = ActorPoolReward(["rw30-hang"], timeout_s=1.0)
    t0 = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"reward actor rw30-hang did not answer within 1 s "
                       r"for 1 samples \(reward_model_timeout_s\): restarted"):
        client.score_batch(["p"], ["a"], [None])
    assert time.perf_counter() - t0 < 10
    assert client.num_timeouts == 1
    from ray.exceptions import ActorUnavailableError

    for _ in range(100):  # restarted, answering again
        try:
            ray_session.get(actor.ready.remote(), timeout=60)
            break
        except ActorUnavailableError:
            time.sleep(0.2)
    else:
        raise AssertionError("the hung reward actor was not restarted")
    ray_session.kill(actor, no_restart=True)
