"""The vLLM API floor the weight syncs need, checked at start-up with fakes (no engine)."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest

from rllib_grpo.samplers.vllm_weights import MIN_VLLM, require_supported_vllm

FULL_WORKER = ("init_weight_transfer_engine", "shutdown_weight_transfer_engine")
PRODUCERS = ("packed_ipc_producer", "packed_nccl_broadcast_producer")


def _fake_vllm(monkeypatch, reload_weights, worker_methods=FULL_WORKER, unique_ids=True,
               producers=PRODUCERS) -> None:
    modules = {
        "vllm.v1.worker.gpu_model_runner": {"GPUModelRunner": type(
            "GPUModelRunner", (), {"reload_weights": reload_weights})},
        "vllm.v1.worker.gpu_worker": {"Worker": type(
            "Worker", (), {m: lambda self: None for m in worker_methods})},
        "vllm.distributed.device_communicators.pynccl": {"PyNcclCommunicator": type(
            "PyNcclCommunicator", (), {"from_unique_id_bytes": classmethod(lambda cls: None)}
            if unique_ids else {})},
    }
    for name, members in modules.items():
        module = types.ModuleType(name)
        vars(module).update(members)
        monkeypatch.setitem(sys.modules, name, module)
    packed = types.ModuleType("vllm.distributed.weight_transfer.packed_tensor")
    vars(packed).update({p: lambda: None for p in producers})
    transfer = types.ModuleType("vllm.distributed.weight_transfer")
    transfer.packed_tensor = packed  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer", transfer)
    monkeypatch.setitem(sys.modules, "vllm.distributed.weight_transfer.packed_tensor", packed)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.12.0"))


def _iterator_reload(self, weights_iterator=None, weights_path=None):
    return None


def test_a_vllm_without_iterator_reloads_is_refused_at_start_up(monkeypatch):
    _fake_vllm(monkeypatch, lambda self: None)  # vLLM < 0.16: reload_weights(self)
    with pytest.raises(RuntimeError, match=rf"vLLM 0.12.0 lacks reload_weights.*vllm>={MIN_VLLM}"):
        require_supported_vllm()
    _fake_vllm(monkeypatch, _iterator_reload)
    require_supported_vllm()


def test_a_vllm_without_the_apis_the_floor_stands_for_is_refused_naming_them(monkeypatch):
    _fake_vllm(monkeypatch, _iterator_reload, worker_methods=FULL_WORKER[:1])
    with pytest.raises(RuntimeError, match=rf"lacks Worker.shutdown_weight_transfer_engine, "
                                           rf"which .* vllm>={MIN_VLLM}"):
        require_supported_vllm()
    _fake_vllm(monkeypatch, _iterator_reload, unique_ids=False)
    with pytest.raises(RuntimeError, match=rf"lacks NCCL groups from a unique id.*{MIN_VLLM}"):
        require_supported_vllm()
    _fake_vllm(monkeypatch, _iterator_reload, producers=PRODUCERS[1:])
    with pytest.raises(RuntimeError, match=r"lacks packed_tensor.packed_ipc_producer"):
        require_supported_vllm()
    monkeypatch.setitem(sys.modules, "vllm.v1.worker.gpu_worker", None)
    with pytest.raises(RuntimeError, match=rf"lacks the weight-transfer modules .*vllm>={MIN_VLLM}"):
        require_supported_vllm()


@pytest.mark.vllm
def test_the_installed_vllm_has_every_api_the_floor_stands_for():
    require_supported_vllm()


def test_the_vllm_extra_pins_the_release_the_check_names():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert re.search(rf'^vllm = \["vllm>={re.escape(MIN_VLLM)}"\]', pyproject, re.M)
