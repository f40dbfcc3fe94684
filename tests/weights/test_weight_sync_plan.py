"""Which weight transport each placement gets (pure functions, no Ray), and its settings."""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.weights.plan import (
    Endpoint,
    choose_transports,
    group_backend,
    predict_transport,
)
from tests.conftest import tiny_config

GPU_A, GPU_B = "GPU-aaaa", "GPU-bbbb"
LEARNER_CPU = Endpoint("node1", 100)
LEARNER_GPU = Endpoint("node1", 100, "cuda", (GPU_A,))


def test_auto_picks_the_fastest_path_the_placement_allows():
    runners = {
        0: Endpoint("node1", 100, dtype=torch.float32),  # the driver itself
        1: Endpoint("node1", 200, dtype=torch.float32),  # another process on the node
    }
    assert choose_transports("auto", LEARNER_CPU, runners) == {0: "local", 1: "shm"}
    gpu_runners = {1: Endpoint("node1", 200, "cuda", (GPU_A, GPU_B)),
                   2: Endpoint("node1", 300, "cuda", (GPU_B,))}  # cannot see the learner's GPU
    assert choose_transports("auto", LEARNER_GPU, {1: gpu_runners[1]}) == {1: "ipc"}
    assert choose_transports("auto", LEARNER_GPU, gpu_runners) == {1: "ipc", 2: "collective"}
    sharded = Endpoint("node1", 100, "cuda", (GPU_A,), sharded=True)
    assert choose_transports("auto", sharded, {1: gpu_runners[1]}) == {1: "collective"}
    # One group, one path: a runner on another node takes the node's shm runners along.
    mixed = {1: Endpoint("node1", 200), 2: Endpoint("node2", 300)}
    assert choose_transports("auto", LEARNER_CPU, mixed) == {1: "collective", 2: "collective"}


def test_forced_transports_and_their_errors():
    remote = {1: Endpoint("node1", 200)}
    assert choose_transports("collective", LEARNER_CPU, remote) == {1: "collective"}
    assert choose_transports("object_store", LEARNER_CPU, remote) == {1: "object_store"}
    # A runner in the learner's process is always handed the tensors.
    assert choose_transports("object_store", LEARNER_CPU, {0: Endpoint("node1", 100)}) == {
        0: "local"}
    with pytest.raises(ValueError, match="weight_sync_transport='local'.*num_env_runners=0"):
        choose_transports("local", LEARNER_CPU, remote)
    with pytest.raises(ValueError, match="'shm' needs one node"):
        choose_transports("shm", LEARNER_CPU, {1: Endpoint("node2", 200)})
    with pytest.raises(ValueError, match="'ipc' needs"):
        choose_transports("ipc", LEARNER_CPU, remote)
    with pytest.raises(ValueError, match="unknown"):
        choose_transports("nccl", LEARNER_CPU, remote)


def test_nccl_only_when_every_member_is_on_a_gpu():
    assert group_backend(LEARNER_GPU, [Endpoint("n", 2, "cuda", (GPU_A,))]) == "nccl"
    assert group_backend(LEARNER_GPU, [Endpoint("n", 2, "cuda"), Endpoint("n", 3)]) == "gloo"
    assert group_backend(LEARNER_CPU, [Endpoint("n", 2)]) == "gloo"


def test_settings_are_checked_and_explained():
    from rllib_grpo.rllib.config.checks import find_errors

    config = tiny_config()
    assert predict_transport(config)[0] == "local"
    assert "weight sync:                   auto -> local" in config.explain()
    config.env_runners(num_env_runners=2)
    assert predict_transport(config)[0] == "shm"
    assert "auto -> shm" in config.explain()
    config.learners(num_learners=1, num_gpus_per_learner=1).env_runners(
        num_gpus_per_env_runner=0.5)
    assert predict_transport(config)[0] == "ipc"

    errors = " ".join(find_errors(tiny_config(weight_sync_transport="carrier-pigeon")))
    assert "weight_sync_transport='carrier-pigeon' is unknown" in errors
    local = tiny_config(weight_sync_transport="local")
    local.env_runners(num_env_runners=1)
    assert any("weight_sync_transport='local'" in e for e in find_errors(local))
    assert any("num_gpus_per_learner > 0" in e
               for e in find_errors(tiny_config(weight_sync_transport="ipc")))
    assert any("weight_sync_bucket_mb=0" in e
               for e in find_errors(tiny_config(weight_sync_bucket_mb=0)))
    assert find_errors(tiny_config(weight_sync_transport="shm")) == []
