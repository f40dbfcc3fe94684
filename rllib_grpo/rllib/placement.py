"""Where this process lives, as both ends of a weight sync describe themselves
(`rllib_grpo.weights.plan.Endpoint`): its Ray node and the GPUs it sees.

Shared by the learner's sender (`rllib_grpo.rllib.learner.weight_sender`) and the env
runner's receiving side (`rllib_grpo.rllib.env_runner.weight_receiver`), which run in
different processes and never import each other; it needs Ray, so it is no part of the
Ray-free `rllib_grpo.weights`.
"""

from __future__ import annotations

import ray
import torch


def node_id() -> str:
    """This process's Ray node (``"local"`` without Ray)."""
    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else "local"


def visible_gpus() -> tuple[str, ...]:
    """The UUIDs of the GPUs this process sees (none without CUDA)."""
    if not torch.cuda.is_available():
        return ()
    return tuple(str(torch.cuda.get_device_properties(i).uuid)
                 for i in range(torch.cuda.device_count()))


def node_gpu_ids() -> tuple[str, ...]:
    """The ids (as in ``CUDA_VISIBLE_DEVICES``) of every GPU on this process's Ray node, not
    only those Ray assigned to it: the node's own ``CUDA_VISIBLE_DEVICES`` where the raylet
    was started with one (Ray records it before narrowing it for this worker), else
    ``0 .. n-1`` for the node's ``n`` GPUs.  Empty without Ray or GPUs."""
    if not ray.is_initialized():
        return ()
    original = ray._private.worker.global_worker.original_visible_accelerator_ids.get("GPU")
    if original is not None:
        return tuple(str(gpu) for gpu in original)
    me = node_id()
    count = next((node["Resources"].get("GPU", 0) for node in ray.nodes()
                  if node["NodeID"] == me), 0)
    return tuple(str(i) for i in range(int(count)))
