"""Which weight transport each env runner gets, from where the learner and the runner live.

``weight_sync_transport="auto"`` picks the fastest path the placement allows:

| placement (learner rank 0 vs. env runner)       | transport      | what moves                 |
|-------------------------------------------------|----------------|----------------------------|
| same process (``num_learners=0``, local runner) | ``local``      | device tensors, copied in place |
| same node, both on one GPU set, FSDP off        | ``ipc``        | CUDA IPC handles; receiver copies |
| same node otherwise (CPU)                       | ``shm``        | buckets through shared memory |
| other node, or GPU with FSDP shards             | ``collective`` | buckets broadcast (NCCL / gloo) |
| no group can be formed                          | ``object_store`` | the state dict through Ray |

Every runner of one weight group uses the same path: if one needs ``collective``, the
others of the group do too.  A forced setting that the placement cannot serve is an error
naming the setting.  Pure functions: tested without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WEIGHT_SYNC_TRANSPORTS = ("auto", "local", "ipc", "shm", "collective", "object_store")
# Numeric codes for the `weight_sync/transport` metric (metrics are numbers).
TRANSPORT_CODES = {"local": 0, "ipc": 1, "shm": 2, "collective": 3, "object_store": 4}
TRANSPORT_NAMES = {code: name for name, code in TRANSPORT_CODES.items()}
GROUP_TRANSPORTS = ("shm", "collective")  # those that need a weight group


@dataclass(frozen=True)
class Endpoint:
    """Where one side of a weight sync lives.

    ``gpus``: the sender's GPU (one UUID) or the GPUs a receiver sees; ``dtype``: the
    sampler's weight dtype (receivers); ``num_ranks``: ranks a receiver takes in a group
    (vLLM: one per worker); ``sharded``: the sender's weights are FSDP shards.
    """

    node_id: str
    pid: int
    device: str = "cpu"
    gpus: tuple[str, ...] = ()
    dtype: Any = None
    num_ranks: int = 1
    sharded: bool = False

    def same_process(self, other: Endpoint) -> bool:
        return self.node_id == other.node_id and self.pid == other.pid


def _auto(sender: Endpoint, receiver: Endpoint) -> str:
    if receiver.same_process(sender):
        return "local"
    if receiver.node_id != sender.node_id:
        return "collective"
    if sender.device == "cuda" and receiver.device == "cuda":
        if not sender.sharded and sender.gpus and sender.gpus[0] in receiver.gpus:
            return "ipc"
        return "collective"  # NCCL between GPUs (or gathered from FSDP shards)
    return "shm"


def choose_transports(setting: str, sender: Endpoint, receivers: dict[int, Endpoint]
                      ) -> dict[int, str]:
    """The transport of each receiver (by env-runner index) under ``setting``."""
    if setting not in WEIGHT_SYNC_TRANSPORTS:
        raise ValueError(f"weight_sync_transport={setting!r} is unknown; use one of: "
                         f"{', '.join(WEIGHT_SYNC_TRANSPORTS)}.")
    chosen: dict[int, str] = {}
    for index, receiver in receivers.items():
        if receiver.same_process(sender):
            chosen[index] = "local"  # nothing beats handing the tensors over
        elif setting == "auto":
            chosen[index] = _auto(sender, receiver)
        else:
            chosen[index] = _forced(setting, sender, receiver, index)
    if any(t == "collective" for t in chosen.values()):  # one group: one path through it
        chosen = {i: "collective" if t == "shm" else t for i, t in chosen.items()}
    return chosen


def _forced(setting: str, sender: Endpoint, receiver: Endpoint, index: int) -> str:
    where = f"env runner {index} (node {receiver.node_id[:8]}, pid {receiver.pid})"
    if setting == "local":
        raise ValueError(
            f"weight_sync_transport='local' needs the learner and every env runner in one "
            f"process, but {where} is another process: use num_learners=0 and "
            "num_env_runners=0, or weight_sync_transport='auto'.")
    if setting in ("ipc", "shm") and receiver.node_id != sender.node_id:
        raise ValueError(f"weight_sync_transport={setting!r} needs one node, but {where} is "
                         "on another node than the learner: use 'collective' or 'auto'.")
    if setting == "ipc" and not (sender.device == receiver.device == "cuda"
                                 and not sender.sharded and sender.gpus
                                 and sender.gpus[0] in receiver.gpus):
        raise ValueError(f"weight_sync_transport='ipc' needs the learner's (unsharded) weights "
                         f"on a GPU that {where} sees: use 'shm', 'collective' or 'auto'.")
    return setting


def group_backend(sender: Endpoint, receivers: list[Endpoint]) -> str:
    """NCCL when the sender and every receiver of the group are on GPUs, else gloo."""
    on_gpus = sender.device == "cuda" and all(r.device == "cuda" for r in receivers)
    return "nccl" if on_gpus else "gloo"


def predict_transport(config: Any) -> tuple[str, str]:
    """What ``auto`` (or the setting) will pick for ``config`` on one node, and why."""
    setting = getattr(config, "weight_sync_transport", "auto")
    local_learner = config.num_learners == 0
    runners = config.num_env_runners
    if local_learner and runners == 0:
        return "local", "learner and sampler in the driver: device tensors copied in place"
    if setting != "auto":
        return setting, "forced by weight_sync_transport"
    learner_gpu = (config.num_gpus_per_learner or 0) > 0
    runner_gpu = (config.num_gpus_per_env_runner or 0) > 0
    sharded = config.num_learners >= 2 and getattr(config, "fsdp", False)
    if learner_gpu and runner_gpu and not sharded:
        return "ipc", ("learner and env runners on one node's GPUs: CUDA IPC handles "
                       "(collective NCCL across nodes or GPUs the runner cannot see)")
    if learner_gpu and runner_gpu:
        return "collective", "FSDP shards gathered per bucket and broadcast over NCCL"
    return "shm", ("learner and env runners on one node: buckets through shared memory "
                   "(collective gloo/NCCL buckets across nodes)")
