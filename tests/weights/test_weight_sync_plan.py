"""Which weight transport each placement gets (`choose_transports`, pure: no Ray), the same
function for a run and for ``explain``; its settings' checks before Ray starts."""

from __future__ import annotations

import pytest

from rllib_grpo.weights.plan import Endpoint, choose_transports, transports_summary
from tests.conftest import tiny_config

GPU_A, GPU_B, GPU_C = "GPU-aaaa", "GPU-bbbb", "GPU-cccc"
LEARNER_CPU = Endpoint("node1", 100)
LEARNER_GPU = Endpoint("node1", 100, "cuda", (GPU_A,))
FSDP_LEARNERS = Endpoint("node1", 100, "cuda", (GPU_A, GPU_B))  # ranks 0 and 1


def engine(pid: int, *gpus: str, node: str = "node1") -> Endpoint:
    return Endpoint(node, pid, "cuda", gpus, vllm_gpu=True)


def test_auto_picks_the_path_the_placement_allows():
    runners = {0: Endpoint("node1", 100), 1: Endpoint("node1", 200), 2: Endpoint("node2", 300)}
    assert choose_transports("auto", LEARNER_CPU, runners) == {
        0: "local", 1: "shm", 2: "object_store"}
    # vLLM engines on GPUs: ipc where every rank shares a learner's GPU, else nccl.
    assert choose_transports("auto", LEARNER_GPU, {1: engine(200, GPU_A), 2: engine(300, GPU_B),
                                                   3: engine(400, GPU_C, node="node2")}) == {
        1: "ipc", 2: "nccl", 3: "nccl"}
    # A transformers sampler on a GPU takes no vLLM engine: host memory.
    hf_on_gpu = Endpoint("node1", 200, "cuda", (GPU_B,))
    assert choose_transports("auto", LEARNER_GPU, {1: hf_on_gpu}) == {1: "shm"}


def test_colocated_engines_of_any_tp_take_ipc_from_every_fsdp_rank():
    """verl's layout: 2 FSDP ranks on GPUs A and B; a TP-2 engine on A and B, or two TP-1
    engines, one on each: each worker opens the IPC buffer of the learner rank on its GPU
    (vLLM's ipc engine, the handles of every rank merged by GPU UUID)."""
    assert choose_transports("auto", FSDP_LEARNERS, {1: engine(200, GPU_A, GPU_B)}) == {1: "ipc"}
    assert choose_transports("auto", FSDP_LEARNERS, {1: engine(200, GPU_A),
                                                     2: engine(300, GPU_B)}) == {1: "ipc",
                                                                                 2: "ipc"}
    # One learner: a TP-2 engine with a rank beside the learner's GPU cannot open it all.
    with pytest.raises(ValueError, match="NCCL weight group would hold learner rank 0 and env "
                                         "runner 1 .* which NCCL refuses"):
        choose_transports("auto", LEARNER_GPU, {1: engine(200, GPU_A, GPU_B)})
    with pytest.raises(ValueError, match="'ipc' needs a vLLM engine on GPUs each of whose"):
        choose_transports("ipc", LEARNER_GPU, {1: engine(200, GPU_B)})


def test_two_nccl_ranks_on_one_gpu_are_refused_naming_the_gpu():
    with pytest.raises(ValueError, match=f"env runner 1 .* and env runner 2 .* on GPU {GPU_B}"):
        choose_transports("auto", LEARNER_GPU, {1: engine(200, GPU_B), 2: engine(300, GPU_B)})


def test_forced_transports_and_their_errors():
    remote = {1: Endpoint("node1", 200)}
    assert choose_transports("shm", LEARNER_CPU, remote) == {1: "shm"}
    assert choose_transports("object_store", LEARNER_CPU, remote) == {1: "object_store"}
    assert choose_transports("nccl", LEARNER_GPU, {1: engine(200, GPU_B)}) == {1: "nccl"}
    with pytest.raises(ValueError, match=f"learner rank 0 and env runner 1 .* on GPU {GPU_A}"):
        choose_transports("nccl", LEARNER_GPU, {1: engine(200, GPU_A)})  # colocated: ipc
    # A runner in the learner's process is always handed the tensors.
    assert choose_transports("object_store", LEARNER_CPU, {0: Endpoint("node1", 100)}) == {
        0: "local"}
    with pytest.raises(ValueError, match="weight_sync_transport='local'.*num_env_runners=0"):
        choose_transports("local", LEARNER_CPU, remote)
    with pytest.raises(ValueError, match="'shm' shares host memory on one node"):
        choose_transports("shm", LEARNER_CPU, {1: Endpoint("node2", 200)})
    with pytest.raises(ValueError, match="'nccl' needs learners and a vLLM engine on GPUs"):
        choose_transports("nccl", LEARNER_CPU, remote)
    with pytest.raises(ValueError, match="'collective' is unknown; use one of: auto, local"):
        choose_transports("collective", LEARNER_CPU, remote)


def test_lora_payloads_and_the_drivers_runner_go_through_the_object_store():
    """LoRA payloads are adapter-only host copies merged on the runner; the driver's env
    runner with remote learners is reached by Ray's object store: never an engine."""
    lora = Endpoint("node1", 100, "cuda", (GPU_A,), host_payload=True)
    assert choose_transports("auto", lora, {1: engine(200, GPU_A)}) == {1: "object_store"}
    for forced in ("ipc", "shm", "nccl"):
        with pytest.raises(ValueError, match="LoRA sync carries the adapter"):
            choose_transports(forced, lora, {1: engine(200, GPU_A)})
    driver = {0: Endpoint("node1", 1, in_driver=True)}
    assert choose_transports("auto", LEARNER_CPU, driver) == {0: "object_store"}
    with pytest.raises(ValueError, match="the driver's env runner .* num_env_runners >= 1"):
        choose_transports("shm", LEARNER_CPU, driver)


def test_the_summary_names_each_transport_and_its_runners():
    assert transports_summary({1: "shm", 2: "shm", 3: "shm", 4: "object_store"}) == \
        "shm (env runners 1-3), object_store (env runner 4)"
    assert transports_summary({0: "local"}) == "local (the driver's env runner)"


def test_settings_are_checked_before_ray_starts_and_explained_by_the_runs_planner():
    from rllib_grpo.rllib.config.checks import find_errors

    config = tiny_config()
    assert "weight sync:                   auto -> local for the driver's env runner (the " \
           "learner's tensors copied into the sampler in place)" in config.explain()
    config.env_runners(num_env_runners=2)
    assert "auto -> shm for env runners 1, 2 (one shared-memory copy" in config.explain()
    colocated = tiny_config(sampler="vllm").colocate(2)
    assert "auto -> ipc for env runners 1, 2 (vLLM's ipc engine, packed CUDA IPC buffers, " \
           "every FSDP rank's handles merged by GPU UUID)" in colocated.explain()

    errors = " ".join(find_errors(tiny_config(weight_sync_transport="carrier-pigeon")))
    assert "weight_sync_transport='carrier-pigeon' is unknown" in errors
    local = tiny_config(weight_sync_transport="local")
    local.env_runners(num_env_runners=1)
    assert any("weight_sync_transport='local' needs the learner" in e for e in find_errors(local))
    assert "weight sync:                   local -> refused (see ERRORS)" in local.explain()
    nccl = tiny_config(weight_sync_transport="nccl")
    nccl.env_runners(num_env_runners=1)
    assert any("'nccl' needs learners and a vLLM engine on GPUs" in e for e in find_errors(nccl))
    lora_ipc = tiny_config(lora_rank=4, weight_sync_transport="ipc", sampler="vllm").colocate(1)
    assert any("LoRA sync carries the adapter" in e for e in find_errors(lora_ipc))
    assert find_errors(tiny_config(weight_sync_transport="shm")) == []
