"""The env runner's side of a weight sync, without a driver: where the runner says it lives,
and the weight-group token the runner owns from its start."""

from __future__ import annotations

import os
from types import SimpleNamespace

import torch

from tests.conftest import tiny_config


def test_a_runner_reports_its_samplers_place_dtype_and_ranks():
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
    from rllib_grpo.rllib.env_runner.weight_receiver import runner_endpoint, runner_prepare
    from rllib_grpo.rllib.placement import node_id
    from rllib_grpo.weights.layout import plan_manifest, split_aliases

    runner = TextEnvRunner(config=tiny_config())
    try:
        endpoint = runner_endpoint(runner)
        assert (endpoint.node_id, endpoint.pid, endpoint.device, endpoint.gpus) == \
            (node_id(), os.getpid(), "cpu", ())
        assert (endpoint.dtype, endpoint.num_ranks) == (torch.float32, 1)
        # No group joined yet: the token is there, and empty (what the driver reads as
        # "form the group again").
        assert runner.weight_group_token is None
        tensors, aliases = split_aliases(runner.sampler.model.state_dict())
        assert runner_prepare(runner, plan_manifest(tensors, aliases=aliases)) is None
    finally:
        runner.stop()


def test_a_sampler_that_cannot_join_a_group_says_so_with_zero_ranks():
    from rllib_grpo.rllib.env_runner.weight_receiver import runner_endpoint

    sampler = SimpleNamespace(device=torch.device("cpu"), weight_dtype=torch.bfloat16,
                              num_weight_ranks=0)
    endpoint = runner_endpoint(SimpleNamespace(sampler=sampler, worker_index=1))
    assert (endpoint.dtype, endpoint.num_ranks) == (torch.bfloat16, 0)


def test_a_tp_engine_that_narrowed_its_gpus_is_placed_by_what_its_workers_report(monkeypatch):
    """A colocated TP=2 engine drives GPUs B and C (CUDA_VISIBLE_DEVICES set before it
    started), while its env runner's CUDA saw Ray's one GPU A: the endpoint must carry the
    workers' GPUs, so the planner never offers CUDA IPC (the learner is on A) and puts the
    two ranks on B and C."""
    from rllib_grpo.rllib.env_runner import weight_receiver
    from rllib_grpo.weights.plan import Endpoint, choose_transports

    monkeypatch.setattr(weight_receiver, "visible_gpus", lambda: ("GPU-A",))
    sampler = SimpleNamespace(device=torch.device("cuda"), weight_dtype=torch.bfloat16,
                              num_weight_ranks=2, takes_gpu_engines=True,
                              rank_gpus=("GPU-B", "GPU-C"))
    endpoint = weight_receiver.runner_endpoint(SimpleNamespace(sampler=sampler, worker_index=1))
    assert endpoint.rank_gpus() == ("GPU-B", "GPU-C")
    learner = Endpoint(endpoint.node_id, 1, "cuda", ("GPU-A",))
    assert choose_transports("auto", learner, {1: endpoint}) == {1: "collective"}
    # Without the workers' report (a transformers sampler), the process's own GPUs.
    del sampler.rank_gpus
    endpoint = weight_receiver.runner_endpoint(SimpleNamespace(sampler=sampler, worker_index=1))
    assert endpoint.gpus == ("GPU-A",)
