"""Where this process lives: its Ray node and the GPUs Ray gave it, as the learners, the env
runners and the reward workers report it (weight-sync endpoints, placement checks), and the
fake-GPU switch.

**Fake GPUs** (`FAKE_GPUS_VARIABLE`, ``RLLIB_GRPO_FAKE_GPUS=1``): Ray schedules GPUs that a
cluster only declares (``ray.init(num_gpus=8)``, ``ray.cluster_utils.Cluster``), so a run's
placement can be tested on a machine without any.  With the switch on, every process
computes on the CPU where Ray assigned it GPUs: learners on CPU tensors (their process group
on gloo), vLLM engines replaced by the transformers sampler, the workers of a tensor-parallel
engine by stand-ins that hold the same reservations (`rllib dry-run` and the fake-GPU tests).

Shared by the learner and the env runner, which run in different processes and never
import each other; it needs Ray, so it is no part of the Ray-free `rllib_grpo.weights`.
"""

from __future__ import annotations

import os
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

FAKE_GPUS_VARIABLE = "RLLIB_GRPO_FAKE_GPUS"
# vLLM's Ray executor reads where an engine's TP workers go from these (set by the driver,
# `rllib_grpo.rllib.algorithm.placement_group.RunPlacement.engine_environment`).
BUNDLES_VARIABLE, WORKER_GPUS_VARIABLE = "VLLM_RAY_BUNDLE_INDICES", "VLLM_RAY_PER_WORKER_GPUS"


def fake_gpus() -> bool:
    """Whether the GPUs Ray assigns are declared only (`FAKE_GPUS_VARIABLE` is ``1``)."""
    return os.environ.get(FAKE_GPUS_VARIABLE) == "1"


HOST_AND_GPU_BACKEND = "cpu:gloo,cuda:nccl"  # torchtune's, for CPU-offloaded shards


def learners_backend(config: Any) -> str | None:
    """The learners' `torch.distributed` backend (Ray Train's ``TorchConfig.backend``).

    ``cpu:gloo,cuda:nccl`` when FSDP keeps the shards in host memory on GPUs:
    ``clip_grad_norm_`` then all-reduces CPU DTensors, which an NCCL-only group cannot
    ("No backend type associated with device type cpu", pytorch#148532).  None otherwise:
    Ray Train's choice (NCCL on GPUs, gloo on CPUs).  gloo where the GPUs are fake
    (`fake_gpus`): the learners compute on the CPU.
    """
    on_gpus = (config.num_gpus_per_learner or 0) > 0
    if on_gpus and fake_gpus():
        return "gloo"
    if on_gpus and config.fsdp and config.fsdp_cpu_offload:
        return HOST_AND_GPU_BACKEND
    return None


def hide_unassigned_gpus() -> None:
    """In a Ray actor that Ray gave no GPU, hide the node's GPUs from this process before
    anything initialises CUDA (Ray 2.60 leaves ``CUDA_VISIBLE_DEVICES`` alone for 0-GPU
    actors, so torch would take ``cuda:0`` without reserving it)."""
    if ray.is_initialized() and ray.get_runtime_context().get_actor_id() is not None \
            and not ray.get_gpu_ids():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def whereabouts() -> dict[str, Any]:
    """This process as the placement tests and ``dry-run`` see it: Ray node, pid, the GPU
    ids Ray assigned it and the ``CUDA_VISIBLE_DEVICES`` it runs with."""
    return {"node_id": node_id(), "pid": os.getpid(),
            "gpu_ids": [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else [],
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}


def node_id() -> str:
    """This process's Ray node (``"local"`` without Ray)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


def fake_gpu_ids(where: dict[str, Any]) -> tuple[str, ...]:
    """The GPUs Ray assigned a process (its `whereabouts`) as ``node:gpu`` ids, unique across
    the cluster: what weight-sync endpoints name where the GPUs are fake."""
    return tuple(f"{where['node_id']}:{gpu}" for gpu in where["gpu_ids"])


def visible_gpus() -> tuple[str, ...]:
    """The UUIDs of the GPUs this process sees (none without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return ()
    return tuple(str(torch.cuda.get_device_properties(i).uuid)
                 for i in range(torch.cuda.device_count()))


def hold_engine_shards(timeout_s: float) -> list[Any]:
    """Where the GPUs are fake: stand-ins for the Ray workers of this env runner's engine of
    TP > 1, each holding what vLLM's Ray executor would reserve for its worker (the share
    of a GPU in its bundle of the current placement group, `BUNDLES_VARIABLE`); empty for
    an engine of TP 1 or on real GPUs (vLLM starts the workers itself).  Raises
    RuntimeError, naming the bundles, when they are not placed within ``timeout_s``."""
    bundles = os.environ.get(BUNDLES_VARIABLE, "")
    if not (fake_gpus() and bundles):
        return []
    group = ray.util.get_current_placement_group()
    share = float(os.environ.get(WORKER_GPUS_VARIABLE, "1"))
    stand_in = ray.remote(EngineShardStandIn)
    shards = [stand_in.options(num_cpus=0, num_gpus=share,
                               scheduling_strategy=PlacementGroupSchedulingStrategy(
                                   group, placement_group_bundle_index=int(bundle)),
                               ).remote() for bundle in bundles.split(",")]
    _, pending = ray.wait([s.whereabouts.remote() for s in shards], num_returns=len(shards),
                          timeout=timeout_s)
    if pending:
        raise RuntimeError(f"the engine's TP workers (bundles {bundles}) were not placed "
                           f"within {timeout_s:g} s")
    return shards


class EngineShardStandIn:
    """One TP worker of a vLLM engine where the GPUs are fake: it holds the worker's
    reservation and reports where it landed."""

    def whereabouts(self) -> dict[str, Any]:
        return whereabouts()
