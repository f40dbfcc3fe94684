"""`rllib_grpo.rllib.cpu_tuning`: what a CPU run changes in its processes, and that a GPU run
changes none of it."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent("""
    import json, resource, sys
    import torch
    from rllib_grpo.rllib.cpu_tuning import keep_freed_host_memory
    kept = keep_freed_host_memory() if sys.argv[1] == "keep" else False
    def faults_of_a_step():  # a step's worth of large tensors (352 MiB), all freed after
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        tensors = [torch.ones(mib * 2**18) for mib in (64, 16, 128, 32, 64, 48)]
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
        del tensors
        return faults
    faults = [faults_of_a_step() for _ in range(8)]
    print(json.dumps({"kept": kept, "again": keep_freed_host_memory() if kept else None,
                      "faults": faults}))
""")
PAGES_OF_A_STEP = 352 * 2**20 // 4096


def _probe(mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
@pytest.mark.processes
def test_a_step_s_freed_pages_serve_the_next_steps_only_when_kept() -> None:
    default = _probe("default")
    kept = _probe("keep")
    assert kept["kept"] is True and kept["again"] is True
    # Default: every tensor is a fresh mmap, faulted in page by page, every step.
    assert all(f > PAGES_OF_A_STEP * 0.9 for f in default["faults"]), default
    # Kept: the first steps grow the heap (glibc's aligned blocks do not always fit the
    # holes the last step left, 1-3 steps here); from the fifth on, it reuses its pages.
    assert kept["faults"][0] > PAGES_OF_A_STEP * 0.9, kept
    assert sum(kept["faults"][4:]) < PAGES_OF_A_STEP // 2, kept  # default: 4 steps' worth


def test_elsewhere_than_glibc_it_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from rllib_grpo.rllib import cpu_tuning

    monkeypatch.setattr(cpu_tuning, "_kept", False)
    monkeypatch.setattr(cpu_tuning.platform, "libc_ver", lambda: ("musl", ""))
    assert cpu_tuning.keep_freed_host_memory() is False


@pytest.mark.parametrize("keep", [True, False])
def test_a_cpu_learner_keeps_freed_memory_as_its_setting_says(
        monkeypatch: pytest.MonkeyPatch, keep: bool) -> None:
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from tests.conftest import tiny_config

    calls: list[bool] = []
    monkeypatch.setattr(cpu_tuning, "keep_freed_host_memory", lambda: calls.append(True))
    config = tiny_config()
    assert config.keep_freed_host_memory is True  # the default
    config.keep_freed_host_memory = keep
    config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    assert calls == ([True] if keep else [])


def test_a_run_with_gpus_is_no_cpu_run() -> None:
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.rllib.cpu_tuning import runs_on_cpu

    assert runs_on_cpu(GRPOConfig())
    assert not runs_on_cpu(GRPOConfig().learners(num_gpus_per_learner=1))
    assert not runs_on_cpu(GRPOConfig().env_runners(num_env_runners=1,
                                                    num_gpus_per_env_runner=0.5))
    assert not runs_on_cpu(GRPOConfig().colocate(2))


@pytest.mark.parametrize("device, tuned", [("cpu", True), ("cuda", False)])
def test_a_learner_is_tuned_on_a_cpu_device_only(
        monkeypatch: pytest.MonkeyPatch, device: str, tuned: bool) -> None:
    """The allocator and the attention switch are not touched for a GPU learner, whatever
    its settings say."""
    import torch

    from rllib_grpo.models import attention
    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    calls: list[str] = []
    monkeypatch.setattr(cpu_tuning, "keep_freed_host_memory", lambda: calls.append("malloc"))
    monkeypatch.setattr(attention, "prefer_matmul_attention",
                        lambda lm, device, dtype: calls.append(f"attention {dtype}"))
    config = GRPOConfig().training(keep_freed_host_memory=True, model_dtype="bfloat16")
    cpu_tuning.tune_cpu_learner(config, torch.device(device), [torch.nn.Linear(1, 1)])
    assert calls == (["malloc", "attention bfloat16"] if tuned else [])


@pytest.mark.parametrize("gpus, tuned", [(0, True), (1, False)])
def test_start_up_is_tuned_on_a_cpu_run_only(
        monkeypatch: pytest.MonkeyPatch, gpus: int, tuned: bool) -> None:
    """On a GPU run `init_local_ray` is ``ray.init`` alone: no import thread, no garbage
    collector paused or frozen, no lock of Ray's held."""
    import contextlib
    import gc

    import ray
    from ray._private import auto_init_hook

    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.algorithm.local_ray import init_local_ray
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    calls: list[str] = []

    @contextlib.contextmanager
    def paused():
        calls.append("gc paused")
        yield

    monkeypatch.setattr(cpu_tuning, "collections_paused", paused)
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("gc.freeze"))
    monkeypatch.setattr(gc, "disable", lambda: calls.append("gc.disable"))
    monkeypatch.setattr(cpu_tuning, "_import_quietly", lambda modules: calls.append("imports"))
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(
        f"ray.init, lock held: {auto_init_hook.auto_init_lock.locked()}"))
    init_local_ray(GRPOConfig().learners(num_gpus_per_learner=gpus))
    if tuned:
        assert calls == ["gc paused", "imports", "ray.init, lock held: True"] or \
            calls == ["gc paused", "ray.init, lock held: True", "imports"]
    else:
        assert calls == ["ray.init, lock held: False"]


@pytest.mark.parametrize("model", ["demo", "smollm2-135m"])
def test_the_demos_are_cpu_runs(model: str) -> None:
    """`make demo` and `make demo-real` get the CPU tuning."""
    from rllib_grpo.demo.catalog import pick_demo
    from rllib_grpo.rllib.cpu_tuning import runs_on_cpu

    assert runs_on_cpu(pick_demo(model).build_config(0, "auto"))
