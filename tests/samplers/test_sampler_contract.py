"""Both samplers implement the `Sampler` protocol with its signatures (a member removed or
renamed in either fails here), and the vLLM sampler the calls a weight sync makes on it
through vLLM's weight-transfer API.  (mypy checks the same statically where
``make_sampler`` returns them as a `Sampler`.)"""

from __future__ import annotations

import inspect
import typing

import pytest
import torch

from rllib_grpo.models import resolve_model
from rllib_grpo.samplers import Sampler
from rllib_grpo.samplers.hf import HFSampler
from rllib_grpo.samplers.vllm import VLLMSampler  # imports no vLLM until one is made

CONTRACT = {"device", "weight_dtype", "generate", "load_weights", "sleep", "wake_up", "close"}
VLLM_API = {"init_weight_transfer_engine", "start_weight_update", "update_weights",
            "finish_weight_update", "check_weight_names", "rank_gpus", "takes_gpu_engines"}


def _members(protocol: type) -> dict[str, object]:
    return {name: value for cls in reversed(protocol.__mro__)
            if cls not in (typing.Protocol, typing.Generic, object)
            for name, value in vars(cls).items() if not name.startswith("_")}


def _check_member(implementation: object, name: str, declared: object) -> None:
    found = inspect.getattr_static(implementation, name)
    if isinstance(declared, property):  # a property, or a plain attribute of an instance
        assert not callable(found) or isinstance(found, property), name
        return
    assert callable(found), name
    declared_parameters = list(inspect.signature(declared).parameters)  # type: ignore[arg-type]
    assert list(inspect.signature(found).parameters)[:len(declared_parameters)] == \
        declared_parameters, name


@pytest.fixture(scope="module")
def hf_sampler(tmp_path_factory):
    return HFSampler(resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models")))


def test_the_protocol_declares_the_contract():
    assert set(_members(Sampler)) == CONTRACT


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_the_vllm_sampler_implements_every_member(name):
    _check_member(VLLMSampler, name, _members(Sampler)[name])


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_the_transformers_sampler_implements_every_member(hf_sampler, name):
    _check_member(hf_sampler, name, _members(Sampler)[name])


def test_the_vllm_sampler_takes_vllms_weight_transfer_calls():
    assert VLLM_API <= set(dir(VLLMSampler))


def test_the_transformers_sampler_is_a_sampler_on_its_own_device(hf_sampler):
    assert isinstance(hf_sampler, Sampler)
    assert hf_sampler.device == torch.device("cpu")
    assert hf_sampler.weight_dtype == torch.float32
