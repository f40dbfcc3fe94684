"""The vLLM worker extension's receive path and vLLM API check, with fakes (no engine)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from rllib_grpo.samplers.vllm_worker import MIN_VLLM, require_supported_vllm

FULL_WORKER = ("init_weight_transfer_engine", "shutdown_weight_transfer_engine")


def _fake_vllm(monkeypatch, reload_weights, worker_methods=FULL_WORKER,
               trainer_engines=("ipc", "nccl")) -> None:
    runner_module = types.ModuleType("vllm.v1.worker.gpu_model_runner")
    runner_module.GPUModelRunner = type("GPUModelRunner", (), {"reload_weights": reload_weights})
    worker_module = types.ModuleType("vllm.v1.worker.gpu_worker")
    worker_module.Worker = type("Worker", (), {m: lambda self: None for m in worker_methods})
    factory_module = types.ModuleType("vllm.distributed.weight_transfer.factory")
    factory_module.WeightTransferTrainerFactory = type(
        "WeightTransferTrainerFactory", (), {"_registry": dict.fromkeys(trainer_engines)})
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.12.0"))
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_model_runner", runner_module)
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", worker_module)
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.factory", factory_module)


def _iterator_reload(self, weights_iterator=None, weights_path=None):
    return None


def test_a_vllm_without_iterator_reloads_is_refused_at_start_up(monkeypatch):
    _fake_vllm(monkeypatch, lambda self: None)  # vLLM < 0.16: reload_weights(self)
    with pytest.raises(RuntimeError, match=rf"vLLM 0.12.0 lacks reload_weights.*vllm>={MIN_VLLM}"):
        require_supported_vllm()
    _fake_vllm(monkeypatch, _iterator_reload)
    require_supported_vllm()


def test_a_vllm_without_the_apis_the_floor_stands_for_is_refused_naming_them(monkeypatch):
    """vLLM 0.28-0.31: no ``Worker.shutdown_weight_transfer_engine``; before 0.28 no NCCL
    trainer engine either; before the trainer factory, no module to import."""
    _fake_vllm(monkeypatch, _iterator_reload, worker_methods=FULL_WORKER[:1])
    with pytest.raises(RuntimeError, match=rf"lacks Worker.shutdown_weight_transfer_engine, "
                                           rf"which .* vllm>={MIN_VLLM}"):
        require_supported_vllm()
    _fake_vllm(monkeypatch, _iterator_reload, trainer_engines=("ipc",))
    with pytest.raises(RuntimeError, match=rf"lacks NCCL trainer engine.*vllm>={MIN_VLLM}"):
        require_supported_vllm()
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.factory", None)
    with pytest.raises(RuntimeError, match=rf"lacks the weight-transfer modules .*vllm>={MIN_VLLM}"):
        require_supported_vllm()


@pytest.mark.vllm
def test_the_installed_vllm_has_every_api_the_floor_stands_for():
    require_supported_vllm()


def test_the_vllm_extra_pins_the_release_the_check_names():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(rf'^vllm = \["vllm>={re.escape(MIN_VLLM)}"\]', pyproject, re.M)
