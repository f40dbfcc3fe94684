"""The environment an env runner sets before its vLLM engine starts: a colocated engine of
TP t > 1 sees the t GPUs of its node it drives (Ray gave its env runner one), via
``CUDA_VISIBLE_DEVICES``, which vLLM's worker processes inherit (fake GPU ids, no GPU)."""

from __future__ import annotations

import os

import pytest

from tests.conftest import tiny_config

EIGHT = ("0", "1", "2", "3", "4", "5", "6", "7")


def _colocated(tp: int):
    return tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp},
                       prompts_per_step=8).colocate(8)


def test_each_colocated_tp_engine_sees_its_two_gpus():
    from rllib_grpo.rllib.env_runner.engine import engine_environment

    config = _colocated(2)
    seen = [engine_environment(config, i, lambda: EIGHT) for i in range(1, 5)]
    assert seen == [{"CUDA_VISIBLE_DEVICES": v} for v in ("0,1", "2,3", "4,5", "6,7")]


def test_ray_assignment_stays_where_it_is_right():
    """TP 1 colocated, or TP engines with GPUs of their own: nothing set, and the node's
    GPUs are not even asked for."""
    from rllib_grpo.rllib.env_runner.engine import engine_environment

    def never():
        raise AssertionError("node GPUs asked for")

    own = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": 2}).env_runners(
        num_env_runners=2, num_gpus_per_env_runner=2)
    for config in (_colocated(1), own, tiny_config()):
        assert engine_environment(config, 1, never) == {}


def test_place_engine_sets_the_variable_before_the_engine_and_refuses_a_short_node(
        monkeypatch):
    from rllib_grpo.rllib.env_runner.engine import place_engine

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")  # what Ray set for this env runner
    assert place_engine(_colocated(2), 3, lambda: EIGHT) == {"CUDA_VISIBLE_DEVICES": "4,5"}
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5"
    with pytest.raises(ValueError, match="need all the learners' GPUs on one node"):
        place_engine(_colocated(2), 3, lambda: EIGHT[:4])  # engines spread over 2 nodes


def test_node_gpu_ids_reads_the_nodes_gpus_not_only_rays_assignment(monkeypatch):
    """`node_gpu_ids`: the node's own CUDA_VISIBLE_DEVICES as Ray recorded it before it
    narrowed this worker's, else 0..n-1 of the node's GPU resource."""
    import ray

    from rllib_grpo.rllib import placement

    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    worker = ray._private.worker.global_worker
    monkeypatch.setattr(worker, "original_visible_accelerator_ids", {"GPU": ["2", "3"]},
                        raising=False)
    assert placement.node_gpu_ids() == ("2", "3")
    monkeypatch.setattr(worker, "original_visible_accelerator_ids", {"GPU": None}, raising=False)
    monkeypatch.setattr(placement, "node_id", lambda: "me")
    monkeypatch.setattr(ray, "nodes", lambda: [
        {"NodeID": "other", "Resources": {"GPU": 2.0}},
        {"NodeID": "me", "Resources": {"GPU": 4.0, "CPU": 8.0}}])
    assert placement.node_gpu_ids() == ("0", "1", "2", "3")
