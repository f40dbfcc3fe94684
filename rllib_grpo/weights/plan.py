"""Which path each env runner's weights take, from where the learners and the runner live.

One function, `choose_transports`, decides for a run (from the places its processes report)
and for ``rllib-grpo explain`` / ``dry-run`` (from the placement plan,
`rllib_grpo.rllib.config.gpu_layout.planned_transports`).  ``weight_sync_transport="auto"``:

| placement (learners vs. the env runner)                      | transport      |
|--------------------------------------------------------------|----------------|
| one process (``num_learners=0``, the driver's env runner)    | ``local``      |
| a vLLM engine each of whose ranks sits on a learner's GPU    | ``ipc``        |
| a vLLM engine on GPUs of its own, this node or another       | ``nccl``       |
| anything else on the learner rank 0's node                   | ``shm``        |
| anything else on another node; a LoRA payload; the driver's  | ``object_store`` |
| env runner with remote learners                              |                |

``ipc`` and ``nccl`` are vLLM's own weight-transfer engines (`VLLM_ENGINES`); ``shm`` is the
host path (`rllib_grpo.weights.shm`); ``object_store`` is Ray's object store, RLlib's way.
NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"): a
placement that would need that is refused, naming the GPU.  A forced setting that the
placement cannot serve is refused, naming the setting.  Pure functions: tested without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass

TRANSPORTS = ("local", "ipc", "nccl", "shm", "object_store")
WEIGHT_SYNC_TRANSPORTS = ("auto", *TRANSPORTS)
# The ``weight_sync/transport`` metric (metrics are numbers): the slowest path of a sync.
TRANSPORT_CODES = {"local": 0, "ipc": 1, "shm": 2, "nccl": 3, "object_store": 4}
VLLM_ENGINES = {"ipc": "ipc", "nccl": "nccl"}  # transport -> vLLM's weight-transfer backend
# Size of the packed buffers of an 'ipc' or 'nccl' sync (vLLM's packed mode): each GPU holds
# at most two besides the model ('ipc': one, at least as large as the largest tensor).
WEIGHT_SYNC_BUCKET_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Endpoint:
    """Where one side of a weight sync lives.

    ``gpus``: the learners' GPUs (rank 0's first), or the GPUs of a receiver's ranks (a vLLM
    engine's workers, in rank order); ids unique across the cluster (CUDA UUIDs; where the
    GPUs are fake, Ray's ``node:gpu``; in a plan, ``node n GPU g``).  ``vllm_gpu``: the
    receiver is a vLLM engine on GPUs (vLLM's ``ipc`` and ``nccl`` engines load into it).
    ``host_payload``: the learners send a payload that lives in host memory (LoRA).
    ``in_driver``: the receiver is the driver's own env runner.
    """

    node_id: str
    pid: int
    device: str = "cpu"
    gpus: tuple[str, ...] = ()
    vllm_gpu: bool = False
    host_payload: bool = False
    in_driver: bool = False

    def same_process(self, other: Endpoint) -> bool:
        return self.node_id == other.node_id and self.pid == other.pid


def choose_transports(setting: str, sender: Endpoint, receivers: dict[int, Endpoint]
                      ) -> dict[int, str]:
    """The transport of each receiver (by env-runner index) under ``setting``; ValueError
    for a setting or a placement that cannot be served."""
    if setting not in WEIGHT_SYNC_TRANSPORTS:
        raise ValueError(f"weight_sync_transport={setting!r} is unknown; use one of: "
                         f"{', '.join(WEIGHT_SYNC_TRANSPORTS)}.")
    chosen = {index: _choose(setting, sender, receiver, _where(index, receiver))
              for index, receiver in receivers.items()}
    _check_nccl_group(sender, {i: receivers[i] for i, t in chosen.items() if t == "nccl"})
    return chosen


def _choose(setting: str, sender: Endpoint, receiver: Endpoint, where: str) -> str:
    if receiver.same_process(sender):
        return "local"  # whatever the setting: nothing beats handing the tensors over
    if sender.host_payload or receiver.in_driver:
        if setting not in ("auto", "object_store"):
            why = ("the driver's env runner is reached through Ray's object store: use "
                   "num_env_runners >= 1" if receiver.in_driver else
                   "a LoRA sync carries the adapter (host copies) through Ray's object store")
            raise ValueError(f"weight_sync_transport={setting!r} for {where}: {why}, or "
                             "weight_sync_transport='auto'.")
        return "object_store"
    on_gpus = sender.device == "cuda" and receiver.vllm_gpu
    shares_learner_gpus = bool(receiver.gpus) and set(receiver.gpus) <= set(sender.gpus)
    same_node = receiver.node_id == sender.node_id
    if setting == "auto":
        if on_gpus:
            return "ipc" if shares_learner_gpus else "nccl"
        return "shm" if same_node else "object_store"
    if setting == "ipc" and not (on_gpus and shares_learner_gpus):
        raise ValueError(f"weight_sync_transport='ipc' needs a vLLM engine on GPUs each of "
                         f"whose ranks shares a learner's GPU, but {where} does not: use "
                         "'nccl' or 'auto'.")
    if setting == "nccl" and not on_gpus:
        raise ValueError(f"weight_sync_transport='nccl' needs learners and a vLLM engine on "
                         f"GPUs, but {where} is not: use 'shm', 'object_store' or 'auto'.")
    if setting == "shm" and not same_node:
        raise ValueError(f"weight_sync_transport='shm' shares host memory on one node, but "
                         f"{where} is on another node than learner rank 0: use "
                         "'object_store' or 'auto'.")
    if setting == "local":
        raise ValueError(f"weight_sync_transport='local' needs the learner and every env "
                         f"runner in one process, but {where} is another process: use "
                         "num_learners=0 and num_env_runners=0, or 'auto'.")
    return setting


def _check_nccl_group(sender: Endpoint, members: dict[int, Endpoint]) -> None:
    """NCCL refuses two ranks of one communicator on one GPU: learner rank 0 and every
    rank of the receivers that take ``nccl``."""
    seen: dict[str, str] = {sender.gpus[0]: "learner rank 0"} if sender.gpus and members else {}
    for index, receiver in sorted(members.items()):
        for gpu in receiver.gpus:
            if gpu in seen:
                raise ValueError(
                    f"the NCCL weight group would hold {seen[gpu]} and "
                    f"{_where(index, receiver)} on GPU {gpu}, which NCCL refuses ('Duplicate "
                    "GPU detected'): give each engine GPUs of its own, or put every rank of "
                    "an engine on a learner's GPU (CUDA IPC, verl's colocated layout).")
            seen[gpu] = _where(index, receiver)


def _where(index: int, receiver: Endpoint) -> str:
    return (f"env runner {index}" if index else "the driver's env runner") + \
        f" (node {receiver.node_id[:12]}, pid {receiver.pid})"


def who_takes(transports: dict[int, str]) -> dict[str, str]:
    """Each transport and the env runners that take it, in words."""
    by_transport: dict[str, list[int]] = {}
    for index, transport in sorted(transports.items()):
        by_transport.setdefault(transport, []).append(index)
    return {t: _runners(ids) for t, ids in by_transport.items()}


def transports_summary(transports: dict[int, str]) -> str:
    """``"shm (env runners 1-3), object_store (env runner 4)"``."""
    return ", ".join(f"{t} ({who})" for t, who in who_takes(transports).items())


def _runners(ids: list[int]) -> str:
    if ids == [0]:
        return "the driver's env runner"
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"env runners {ids[0]}-{ids[-1]}"
    return f"env runner{'s' if len(ids) > 1 else ''} {', '.join(map(str, ids))}"


def describe(transport: str, sharded: bool = False) -> str:
    """What moves on ``transport``, in a few words (``explain``)."""
    gathered = ", every FSDP rank's handles merged by GPU UUID" if sharded else ""
    return {"local": "the learner's tensors copied into the sampler in place",
            "ipc": f"vLLM's ipc engine, packed CUDA IPC buffers{gathered}",
            "nccl": "vLLM's nccl engine, packed broadcasts from learner rank 0",
            "shm": "one shared-memory copy of the weights on the node, read by each sampler",
            "object_store": "the state dict through Ray's object store (RLlib's way)",
            }[transport]
