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
    gpu_runners = {1: Endpoint("node1", 200, "cuda", (GPU_A, GPU_B), gpu_engines=True),
                   2: Endpoint("node1", 300, "cuda", (GPU_B,), gpu_engines=True)}  # cannot see the learner's GPU
    assert choose_transports("auto", LEARNER_GPU, {1: gpu_runners[1]}) == {1: "ipc"}
    assert choose_transports("auto", LEARNER_GPU, gpu_runners) == {1: "ipc", 2: "collective"}
    sharded = Endpoint("node1", 100, "cuda", (GPU_A,), sharded=True)
    assert choose_transports("auto", sharded, {1: gpu_runners[1]}) == {1: "ipc"}  # gathered
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


FSDP_LEARNER_0 = Endpoint("node1", 100, "cuda", (GPU_A,), sharded=True)


def test_a_runner_on_the_learners_gpu_gets_ipc_never_an_nccl_rank_beside_it():
    """FSDP learners with an env runner on learner 0's GPU: NCCL refuses two ranks of one
    group on one GPU ("Duplicate GPU detected", NVIDIA/nccl#1241): IPC of the full gather."""
    colocated = Endpoint("node1", 200, "cuda", (GPU_A,), gpu_engines=True)
    elsewhere = Endpoint("node1", 300, "cuda", (GPU_B,), gpu_engines=True)
    chosen = choose_transports("auto", FSDP_LEARNER_0, {1: colocated, 2: elsewhere})
    assert chosen == {1: "ipc", 2: "collective"}
    members = [e for i, e in {1: colocated, 2: elsewhere}.items() if chosen[i] == "collective"]
    assert group_backend(FSDP_LEARNER_0, members) == "nccl"  # one rank per GPU
    # Forced into one NCCL group with the learner: refused at discovery, naming the fix.
    with pytest.raises(ValueError, match="Duplicate GPU detected.*'auto'"):
        choose_transports("collective", FSDP_LEARNER_0, {1: colocated})
    # 'ipc' serves FSDP now (rank 0 shares the gathered tensors).
    assert choose_transports("ipc", FSDP_LEARNER_0, {1: colocated}) == {1: "ipc"}


def test_two_runners_on_one_gpu_make_a_gloo_group_or_are_refused_when_forced():
    on_b = {1: Endpoint("node1", 200, "cuda", (GPU_B,), gpu_engines=True), 2: Endpoint("node1", 300, "cuda", (GPU_B,), gpu_engines=True)}
    assert choose_transports("auto", LEARNER_GPU, on_b) == {1: "collective", 2: "collective"}
    assert group_backend(LEARNER_GPU, list(on_b.values())) == "gloo"
    with pytest.raises(ValueError, match=f"GPU {GPU_B}"):
        choose_transports("collective", LEARNER_GPU, on_b)
    # A vLLM engine of 2 workers takes its first two visible GPUs: no clash with GPU_A.
    tp2 = Endpoint("node2", 400, "cuda", (GPU_B, "GPU-cccc"), num_ranks=2, gpu_engines=True)
    assert group_backend(LEARNER_GPU, [tp2]) == "nccl"


def test_a_lora_payload_in_host_memory_goes_through_the_object_store():
    """LoRA payloads are adapter-only host copies (`models.lora.sync_payload`), merged on
    the runner: Ray's object store, never a weight-transfer engine."""
    lora_learner = Endpoint("node1", 100, "cuda", (GPU_A,), host_payload=True)
    colocated = {1: Endpoint("node1", 200, "cuda", (GPU_A,), gpu_engines=True)}
    assert choose_transports("auto", lora_learner, colocated) == {1: "object_store"}
    assert choose_transports("auto", lora_learner, {1: Endpoint("node1", 3, "cuda", (GPU_B,), gpu_engines=True)}
                             ) == {1: "object_store"}
    for forced in ("ipc", "shm", "collective", "delta"):
        with pytest.raises(ValueError, match="LoRA syncs carry the adapter"):
            choose_transports(forced, lora_learner, colocated)
    config = tiny_config(lora_rank=4)
    config.learners(num_learners=1, num_gpus_per_learner=1).env_runners(
        num_env_runners=1, num_gpus_per_env_runner=0.5)
    assert predict_transport(config)[0] == "object_store"


def test_placements_nccl_refuses_are_refused_before_ray_starts():
    from rllib_grpo.rllib.config.checks import find_errors

    halves = tiny_config()
    halves.learners(num_learners=2, num_gpus_per_learner=0.5)
    errors = [e for e in find_errors(halves) if "num_gpus_per_learner=0.5" in e]
    assert len(errors) == 1 and "num_gpus_per_learner=1" in errors[0]
    whole = tiny_config()
    whole.learners(num_learners=2, num_gpus_per_learner=1)
    assert not [e for e in find_errors(whole) if "num_gpus_per_learner" in e]
    lora_ipc = tiny_config(lora_rank=4, weight_sync_transport="ipc")
    lora_ipc.learners(num_learners=1, num_gpus_per_learner=1).env_runners(
        num_gpus_per_env_runner=1)
    assert any("lora_rank=4" in e and "'shm'" in e for e in find_errors(lora_ipc))


def test_nccl_only_when_every_member_is_on_a_gpu():
    assert group_backend(LEARNER_GPU, [Endpoint("n", 2, "cuda", (GPU_B,), gpu_engines=True)]) == "nccl"
    # Two ranks on one GPU: NCCL refuses it, gloo does not.
    assert group_backend(LEARNER_GPU, [Endpoint("n", 2, "cuda", (GPU_A,), gpu_engines=True)]) == "gloo"
    assert group_backend(LEARNER_GPU, [Endpoint("n", 2, "cuda", gpu_engines=True), Endpoint("n", 3)]) == "gloo"
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
    for timeout in (0, -5, float("nan")):
        assert f"weight_sync_connect_timeout_s={timeout!r} must be a finite number > 0." in (
            find_errors(tiny_config(weight_sync_connect_timeout_s=timeout)))
    assert find_errors(tiny_config(weight_sync_transport="shm")) == []


def test_cuda_ipc_only_when_every_rank_of_the_engine_is_on_the_learners_gpu():
    """vLLM's ipc engine looks each worker's own GPU up in the handles of the learner's one
    GPU: a TP=2 engine with a rank on the learner's GPU and one beside it cannot take them.
    Its group then has two ranks on GPU A (the learner and rank 0): gloo, not NCCL."""
    tp2 = Endpoint("node1", 200, "cuda", (GPU_A, GPU_B), num_ranks=2, gpu_engines=True)
    assert choose_transports("auto", LEARNER_GPU, {1: tp2}) == {1: "collective"}
    assert group_backend(LEARNER_GPU, [tp2]) == "gloo"
    with pytest.raises(ValueError, match="ipc"):
        choose_transports("ipc", LEARNER_GPU, {1: tp2})
    tp1 = Endpoint("node1", 200, "cuda", (GPU_A, GPU_B), num_ranks=1, gpu_engines=True)
    assert choose_transports("auto", LEARNER_GPU, {1: tp1}) == {1: "ipc"}  # rank 0 on A


def test_explain_names_the_weight_transfer_engine():
    cpu = tiny_config(weight_sync_transport="delta")
    cpu.env_runners(num_env_runners=1)
    assert "delta, vLLM weight-transfer engine grpo_sparse_gloo" in cpu.explain()
    shm = tiny_config()
    shm.env_runners(num_env_runners=1)
    assert "-> shm, vLLM weight-transfer engine grpo_shm" in shm.explain()
