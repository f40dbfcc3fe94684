"""`rllib_grpo.cli.startup`: the demo's import prefetch while ``ray.init`` waits."""

from __future__ import annotations

import os
import sys

import pytest

from rllib_grpo.cli import startup


@pytest.mark.parametrize("load, room", [(0.5, True), (3.9, True), (4.0, False), (20.0, False)])
def test_machine_has_room_below_twice_the_core_count(monkeypatch, load, room):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(os, "getloadavg", lambda: (load, 0.0, 0.0))
    assert startup.machine_has_room() is room


def test_no_load_average_counts_as_room(monkeypatch):
    def missing():
        raise OSError("no load average")

    monkeypatch.setattr(os, "getloadavg", missing)
    assert startup.machine_has_room()


def test_prefetch_is_skipped_on_a_busy_machine(monkeypatch):
    monkeypatch.setattr(startup, "machine_has_room", lambda: False)
    assert startup.prefetch_imports("vllm") is None


@pytest.mark.parametrize("sampler, with_vllm", [("vllm", True), ("auto", True), ("hf", False)])
def test_prefetch_imports_vllm_only_for_a_sampler_that_may_use_it(monkeypatch, sampler,
                                                                     with_vllm):
    calls = []
    monkeypatch.setattr(startup, "machine_has_room", lambda: True)
    monkeypatch.setattr(startup, "_import_heavy_modules", calls.append)
    thread = startup.prefetch_imports(sampler)
    assert thread is not None and thread.daemon
    thread.join(timeout=10)
    assert calls == [with_vllm]


def test_a_failing_import_in_the_thread_is_left_to_the_build_to_report(monkeypatch):
    """No vLLM (or a broken one): the thread ends quietly; the sampler's build imports it
    again and raises there, with its usual message."""
    monkeypatch.setitem(sys.modules, "rllib_grpo.samplers.vllm", None)  # import -> ImportError
    startup._import_heavy_modules(with_vllm=True)  # must not raise
    assert "torch" in sys.modules and "transformers" in sys.modules
