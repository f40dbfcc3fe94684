"""verl's memory choreography (`rllib_grpo.rllib.choreography`) in a real training step: the
engine sleeps through the update, the learner frees its cached GPU memory before the
engine wakes its weights, the sync fills them, the KV cache wakes last, then the next step
samples."""

from __future__ import annotations

from typing import Any

import torch

from tests.conftest import tiny_config


def test_engines_sleep_at_level_2_unless_a_sync_sends_part_of_the_weights():
    from rllib_grpo.rllib.choreography import sleep_level

    assert sleep_level(tiny_config()) == 2
    assert sleep_level(tiny_config(lora_rank=4)) == 1  # merged LoRA layers only
    assert sleep_level(tiny_config(weight_sync_transport="delta")) == 1  # changed elements


class _RecordingEngine:
    """The env runner's sampler, recording what the step asks of it in ``calls``."""

    def __init__(self, sampler: Any, calls: list[str]) -> None:
        self._sampler, self._calls = sampler, calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append("sample")
        return self._sampler.generate(*args, **kwargs)

    def sleep(self, level: int = 1) -> None:
        self._calls.append(f"sleep({level})")

    def wake_up(self, tags: Any = None) -> None:
        self._calls.append(f"wake_up({tags})")

    def load_weights(self, *args: Any, **kwargs: Any) -> Any:
        self._calls.append("sync")
        return self._sampler.load_weights(*args, **kwargs)


def test_a_colocated_step_frees_the_learner_cache_before_the_engine_wakes(ray_session,
                                                                         monkeypatch):
    """The local learner and env runner of a one-GPU run (one process, as `colocate(1)`
    in local mode); the calls the driver, the learner and the engine make, in order.  The
    layout that makes engines sleep is simulated (``sampler_sleeps``) and the CUDA
    allocator is a recorder: this machine has no GPU."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    calls: list[str] = []
    monkeypatch.setattr(GRPOConfig, "sampler_sleeps", property(lambda self: True))
    algo = tiny_config().build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        runner.sampler = _RecordingEngine(runner.sampler, calls)
        learner = algo.learner_group._learner
        update = learner.update
        monkeypatch.setattr(learner, "update", lambda *a, **kw: calls.append("update")
                            or update(*a, **kw))
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
        algo.train()
        algo.train()
        grads = [p.grad for p in learner.module["default_policy"].unwrapped().lm.parameters()]
    finally:
        algo.stop()
    one_step = ["sleep(2)", "update", "empty_cache", "wake_up(['weights'])", "sync",
                "empty_cache", "wake_up(['kv_cache'])"]
    assert calls[0] == "sample"
    assert [c for c in calls if c != "sample"] == one_step * 2, calls
    # The second step samples after the first one's KV cache woke, before its own sleep.
    woke, slept_again = calls.index("wake_up(['kv_cache'])"), len(calls) - len(one_step)
    assert "sample" in calls[woke:slept_again], calls
    assert all(g is None for g in grads)  # the learner dropped its gradients
