"""`keep_freed_host_memory`: the pages of a step's freed tensors serve the next step."""

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
    from rllib_grpo.models.host_memory import keep_freed_host_memory
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
    from rllib_grpo.models import host_memory

    monkeypatch.setattr(host_memory, "_kept", False)
    monkeypatch.setattr(host_memory.platform, "libc_ver", lambda: ("musl", ""))
    assert host_memory.keep_freed_host_memory() is False


@pytest.mark.parametrize("keep", [True, False])
def test_a_cpu_learner_keeps_freed_memory_as_its_setting_says(
        monkeypatch: pytest.MonkeyPatch, keep: bool) -> None:
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.learner import learner as learner_module
    from tests.conftest import tiny_config

    calls: list[bool] = []
    monkeypatch.setattr(learner_module, "keep_freed_host_memory", lambda: calls.append(True))
    config = tiny_config()
    assert config.keep_freed_host_memory is True  # the default
    config.keep_freed_host_memory = keep
    config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    assert calls == ([True] if keep else [])
