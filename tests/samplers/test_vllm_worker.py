"""The vLLM worker extension's receive path and vLLM API check, with fakes (no engine)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from rllib_grpo.samplers.vllm_worker import MIN_VLLM, require_layerwise_reload


def _fake_vllm(monkeypatch, reload_weights) -> None:
    runner_module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    runner_module.GPUModelRunner = type("GPUModelRunner", (), {"reload_weights": reload_weights})
    worker_module = types.ModuleType("vllm.v1.worker.gpu_worker")
    worker_module.Worker = type("Worker", (), {"init_weight_transfer_engine": lambda self: None})
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.12.0"))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", runner_module)
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", worker_module)


def test_a_vllm_without_iterator_reloads_is_refused_at_start_up(monkeypatch):
    _fake_vllm(monkeypatch, lambda self: None)  # vLLM < 0.16: reload_weights(self)
    with pytest.raises(RuntimeError, match=rf"vLLM 0.12.0 has no reload_weights.*vllm>={MIN_VLLM}"):
        require_layerwise_reload()
    _fake_vllm(monkeypatch, lambda self, weights_iterator=None, weights_path=None: None)
    require_layerwise_reload()


def test_the_vllm_extra_pins_the_release_the_check_names():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(rf'^vllm = \["vllm>={re.escape(MIN_VLLM)}"\]', pyproject, re.M)
