"""Both samplers implement the whole weight-receiving contract (`WeightReceiver`, which
`Sampler` extends), with its signatures: a member removed or renamed in either fails here.
(mypy checks the same statically where ``make_sampler`` returns them as a `Sampler`.)"""

from __future__ import annotations

import inspect
import typing

import pytest
import torch

from rllib_grpo.models import resolve_model
from rllib_grpo.samplers import Sampler
from rllib_grpo.samplers.hf import HFSampler
from rllib_grpo.samplers.vllm import VLLMSampler  # imports no vLLM until one is made
from rllib_grpo.weights.receiver import WeightReceiver

CONTRACT = {"device", "weight_dtype", "num_weight_ranks", "join_weight_group",
            "prepare_weights", "receive_weights", "leave_weight_group",
            # vLLM's weight-transfer API, which every sync now goes through
            "init_weight_transfer_engine", "start_weight_update", "update_weights",
            "finish_weight_update", "shutdown_weight_transfer_engine"}


def _members(protocol: type) -> dict[str, object]:
    """A protocol's declared members (its own and its protocol bases'), by name."""
    return {name: value for cls in reversed(protocol.__mro__)
            if cls not in (typing.Protocol, typing.Generic, object)
            for name, value in vars(cls).items() if not name.startswith("_")}


def _check_member(implementation: object, name: str, declared: object) -> None:
    found = inspect.getattr_static(implementation, name)
    if isinstance(declared, property):  # a property, or a plain attribute of an instance
        assert not callable(found) or isinstance(found, property), name
        return
    assert callable(found), name
    assert list(inspect.signature(found).parameters) == \
        list(inspect.signature(declared).parameters), name  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def hf_sampler(tmp_path_factory):
    return HFSampler(resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models")))


def test_the_receiving_contract_is_declared_and_the_sampler_protocol_extends_it():
    assert set(_members(WeightReceiver)) == CONTRACT
    assert CONTRACT <= set(_members(Sampler))
    assert WeightReceiver in Sampler.__mro__


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_the_vllm_sampler_implements_every_member(name):
    _check_member(VLLMSampler, name, _members(WeightReceiver)[name])


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_the_transformers_sampler_implements_every_member(hf_sampler, name):
    _check_member(hf_sampler, name, _members(WeightReceiver)[name])


def test_the_transformers_sampler_is_a_receiver_that_takes_one_rank(hf_sampler):
    assert isinstance(hf_sampler, WeightReceiver) and isinstance(hf_sampler, Sampler)
    assert hf_sampler.num_weight_ranks == 1
    assert hf_sampler.device == torch.device("cpu")
    assert hf_sampler.weight_dtype == torch.float32
