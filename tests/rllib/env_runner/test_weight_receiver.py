"""An env runner's side of a weight sync, without a driver: where it says its sampler
lives (real GPUs: its engine's workers; fake GPUs: the GPUs Ray assigned, so the planner
decides as for real ones), and a load from the node's shared weights file, in place."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from tests.conftest import tiny_config


def test_a_runner_reads_the_shared_file_into_its_live_parameters():
    from rllib_grpo.models import load_causal_lm, resolve_model
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
    from rllib_grpo.rllib.env_runner.weight_receiver import runner_endpoint, runner_receive_shared
    from rllib_grpo.rllib.placement import node_id
    from rllib_grpo.weights.shm import SharedOffer, SharedWeights, plan_manifest, split_aliases

    runner = TextEnvRunner(config=tiny_config())
    shared = None
    try:
        place = runner_endpoint(runner)
        endpoint = place["endpoint"]
        assert (endpoint.node_id, endpoint.pid, endpoint.device, endpoint.gpus) == (
            node_id(), os.getpid(), "cpu", ())
        assert (place["dtype"], place["backend"], endpoint.in_driver) == (torch.float32, None, True)
        model = runner.sampler.model
        storage = {n: p.data_ptr() for n, p in model.named_parameters()}
        moved = load_causal_lm(resolve_model(runner.config.model_path)).state_dict()
        moved = {k: v + 0.25 for k, v in moved.items()}
        moved["lm_head.weight"] = moved["model.embed_tokens.weight"]  # tied
        tensors, aliases = split_aliases(moved)
        manifest = plan_manifest(tensors, aliases=aliases)
        shared = SharedWeights.create(manifest.nbytes)
        shared.write(manifest, tensors.__getitem__, stamp=3)
        runner_receive_shared(runner, SharedOffer(shared.path, manifest, stamp=3, seq_no=5))
        for name, tensor in model.state_dict().items():
            assert torch.equal(tensor, moved[name]), name
        assert {n: p.data_ptr() for n, p in model.named_parameters()} == storage  # in place
        assert runner._weights_seq_no == 5 and runner.last_weight_sync["bytes"] == manifest.nbytes
        # A foreign layout is refused before a byte is copied.
        foreign = plan_manifest({**tensors, "model.extra.weight": torch.zeros(2)})
        other = SharedWeights.create(foreign.nbytes)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        with pytest.raises(KeyError, match="model.extra.weight"):
            other.write(foreign, {**tensors, "model.extra.weight": torch.zeros(2)}.__getitem__, 1)
            runner_receive_shared(runner, SharedOffer(other.path, foreign, stamp=1, seq_no=6))
        other.close(remove=True)
        assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    finally:
        if shared is not None:
            shared.close(remove=True)
        runner.stop()


def _runner(sampler, index: int = 1, sampler_kind: str = "vllm") -> SimpleNamespace:
    return SimpleNamespace(sampler=sampler, worker_index=index, engine_shards=[],
                           config=SimpleNamespace(sampler=sampler_kind))


def test_a_tp_engine_that_narrowed_its_gpus_is_placed_by_what_its_workers_report(monkeypatch):
    """A colocated TP=2 engine drives GPUs B and C (CUDA_VISIBLE_DEVICES set before it
    started), while its env runner's CUDA saw Ray's one GPU A: the endpoint carries the
    workers' GPUs, so the planner gives it ipc only where B and C hold learners."""
    from rllib_grpo.rllib.env_runner import weight_receiver
    from rllib_grpo.weights.plan import Endpoint, choose_transports

    monkeypatch.setattr(weight_receiver, "visible_gpus", lambda: ("GPU-A",))
    sampler = SimpleNamespace(device=torch.device("cuda"), weight_dtype=torch.bfloat16,
                              takes_gpu_engines=True, rank_gpus=("GPU-B", "GPU-C"),
                              weight_transfer_backend="ipc")
    place = weight_receiver.runner_endpoint(_runner(sampler))
    endpoint = place["endpoint"]
    assert (endpoint.gpus, endpoint.vllm_gpu, place["backend"]) == (("GPU-B", "GPU-C"), True,
                                                                    "ipc")
    learners = Endpoint(endpoint.node_id, 1, "cuda", ("GPU-B", "GPU-C"))
    assert choose_transports("auto", learners, {1: endpoint}) == {1: "ipc"}
    # Without the workers' report (a transformers sampler), the process's own GPUs: shm.
    hf = SimpleNamespace(device=torch.device("cuda"), weight_dtype=torch.float32)
    endpoint = weight_receiver.runner_endpoint(_runner(hf, sampler_kind="hf"))["endpoint"]
    assert (endpoint.gpus, endpoint.vllm_gpu) == (("GPU-A",), False)


def test_where_gpus_are_fake_a_runner_names_the_gpus_ray_assigned_its_engine(monkeypatch):
    from rllib_grpo.rllib.env_runner import weight_receiver

    monkeypatch.setattr(weight_receiver, "fake_gpus", lambda: True)
    shards = [{"node_id": "n1", "gpu_ids": ["2"]}, {"node_id": "n1", "gpu_ids": ["3"]}]
    monkeypatch.setattr(weight_receiver, "engine_whereabouts", lambda sampler, held: shards)
    cpu_sampler = SimpleNamespace(device=torch.device("cpu"), weight_dtype=torch.float32)
    endpoint = weight_receiver.runner_endpoint(_runner(cpu_sampler))["endpoint"]
    assert (endpoint.device, endpoint.gpus, endpoint.vllm_gpu) == ("cuda", ("n1:2", "n1:3"), True)
    endpoint = weight_receiver.runner_endpoint(_runner(cpu_sampler, sampler_kind="hf"))["endpoint"]
    assert endpoint.vllm_gpu is False  # the config's own transformers sampler: no vLLM engine
