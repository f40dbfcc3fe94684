"""Which weight transport each env runner gets, from where the learner and the runner live,
and which weight-transfer engine (vLLM's factory name, `engine_backend`) carries it.

``weight_sync_transport="auto"`` picks the fastest path the placement allows:

| placement (learner rank 0 vs. env runner)       | transport      | what moves                 |
|-------------------------------------------------|----------------|----------------------------|
| same process (``num_learners=0``, local runner) | ``local``      | device tensors, copied in place |
| same node, the runner sees the learner's GPU    | ``ipc``        | CUDA IPC handles (FSDP: of a full gather on rank 0); receiver copies |
| same node, CPU, or a payload in host memory     | ``shm``        | buckets through shared memory |
| same node on other GPUs, or other node          | ``collective`` | buckets broadcast (NCCL / gloo) |
| no group can be formed; a LoRA payload; the     | ``object_store`` | the state dict through Ray |
| driver's env runner with a remote learner       |                |                            |

Every transport but ``local`` and ``object_store`` is a weight-transfer engine driven
through vLLM's API (`engine_backend`): ``ipc`` -> vLLM's ``ipc``; ``collective`` -> vLLM's
``nccl`` (GPUs) or our ``grpo_gloo``; ``shm`` -> our ``grpo_shm``; ``delta`` (never picked
by ``auto``: set ``weight_sync_transport="delta"``) -> our ``grpo_sparse_gloo`` on every
device: only the elements that changed since the last sync travel (a tensor whole where
that is fewer bytes), over a gloo group.  vLLM's ``sparse_nccl`` is not used: it has no
dense form and its in-place loader fails on vLLM's CPU layers
(`rllib_grpo.weights.engines.SparseGlooEngine` says why).  vLLM's
GPU engines load into vLLM models only: a transformers sampler gets our host engines.

A runner on the learner's GPU never becomes an NCCL rank next to the learner: NCCL
refuses two ranks of one communicator on one GPU ("Duplicate GPU detected",
NVIDIA/nccl#1241).  It gets CUDA IPC instead; with FSDP, learner rank 0 gathers the full
tensors first (as verl's colocated layout does).  A payload that lives in host memory (a
LoRA payload: host copies by design, the runners merge from a host copy of the base) is
never offered to CUDA IPC; it goes through shared memory.

Every runner of one weight group uses the same path: if one needs ``collective``, the
others of the group do too; where two of its ranks would share a GPU the group is gloo
(``auto``) or refused (``collective`` forced).  A forced setting that the placement cannot
serve is an error naming the setting.  Pure functions: tested without Ray.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

WEIGHT_SYNC_TRANSPORTS = ("auto", "local", "ipc", "shm", "collective", "delta", "object_store")
# Numeric codes for the `weight_sync/transport` metric (metrics are numbers).
TRANSPORT_CODES = {"local": 0, "ipc": 1, "shm": 2, "collective": 3, "object_store": 4,
                   "delta": 5}
TRANSPORT_NAMES = {code: name for name, code in TRANSPORT_CODES.items()}
GROUP_TRANSPORTS = ("shm", "collective", "delta")  # those that need a weight group
ENGINE_TRANSPORTS = ("ipc", *GROUP_TRANSPORTS)  # those a weight-transfer engine carries


@dataclass(frozen=True)
class Endpoint:
    """Where one side of a weight sync lives.

    ``gpus``: the sender's GPU (one UUID) or the GPUs a receiver's ranks run on, in rank
    order (a vLLM engine's workers report theirs: a colocated tensor-parallel engine narrows
    ``CUDA_VISIBLE_DEVICES`` to its own, which its env runner need not see; otherwise the
    GPUs the receiver sees, its ranks on the first ``num_ranks``);
    ``dtype``: the sampler's weight dtype (receivers); ``num_ranks``: ranks a receiver
    takes in a group (vLLM: one per worker); ``sharded``: the sender's weights are FSDP
    shards; ``host_payload``: what the sender sends lives in host memory (LoRA payloads).
    """

    node_id: str
    pid: int
    device: str = "cpu"
    gpus: tuple[str, ...] = ()
    dtype: Any = None
    num_ranks: int = 1
    sharded: bool = False
    host_payload: bool = False
    gpu_engines: bool = False
    in_driver: bool = False

    def same_process(self, other: Endpoint) -> bool:
        return self.node_id == other.node_id and self.pid == other.pid

    def rank_gpus(self) -> tuple[str, ...]:
        """The GPU of each of its ranks in a weight group (none on CPU)."""
        return self.gpus[: max(1, self.num_ranks)] if self.device == "cuda" else ()


def _sees_sender_gpu(sender: Endpoint, receiver: Endpoint) -> bool:
    """Every rank of the receiver runs on the sender's GPU, so each can open the CUDA IPC
    handles of the sender's payload (vLLM's ``ipc`` engine looks its own GPU's UUID up in
    them): a tensor-parallel engine's other ranks are on other GPUs and cannot."""
    return (sender.device == receiver.device == "cuda" and not sender.host_payload
            and receiver.gpu_engines and bool(sender.gpus)
            and set(receiver.rank_gpus()) == {sender.gpus[0]}
            and receiver.node_id == sender.node_id)


def _auto(sender: Endpoint, receiver: Endpoint) -> str:
    if receiver.same_process(sender):
        return "local"
    if _sees_sender_gpu(sender, receiver):
        return "ipc"  # never an NCCL rank on the learner's GPU
    if receiver.node_id != sender.node_id:
        return "collective"
    if (sender.device == "cuda" and receiver.device == "cuda" and receiver.gpu_engines
            and not sender.host_payload):
        return "collective"  # NCCL between two GPUs of the node
    return "shm"


def shared_gpus(sender: Endpoint, receivers: list[Endpoint]) -> list[str]:
    """GPUs that two ranks of one weight group would share (sender: rank 0)."""
    seen: set[str] = set()
    shared: list[str] = []
    for gpu in [*sender.rank_gpus()[:1], *(g for r in receivers for g in r.rank_gpus())]:
        if gpu in seen and gpu not in shared:
            shared.append(gpu)
        seen.add(gpu)
    return shared


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
        elif sender.host_payload or receiver.in_driver:
            chosen[index] = _through_ray(setting, receiver, index)
        elif setting == "auto":
            chosen[index] = _auto(sender, receiver)
        else:
            chosen[index] = _forced(setting, sender, receiver, index)
    if any(t == "collective" for t in chosen.values()):  # one group: one path through it
        chosen = {i: "collective" if t == "shm" else t for i, t in chosen.items()}
    if setting == "delta":
        chosen = {i: "delta" if t in GROUP_TRANSPORTS else t for i, t in chosen.items()}
    if setting == "collective":
        members = [receivers[i] for i, t in chosen.items() if t == "collective"]
        shared = shared_gpus(sender, members)
        if shared and group_backend(sender, members, refuse_shared=False) == "nccl":
            raise ValueError(
                f"weight_sync_transport='collective' would put two ranks of one NCCL group "
                f"on GPU {', '.join(shared)}, which NCCL refuses ('Duplicate GPU detected', "
                "NVIDIA/nccl#1241): use 'auto' (CUDA IPC for a runner on the learner's GPU) "
                "or give each env runner a GPU of its own.")
    return chosen


def _through_ray(setting: str, receiver: Endpoint, index: int) -> str:
    """A LoRA payload (adapter-only, host copies, merged on the runner) or the driver's own
    runner with a remote learner: Ray's object store; a forced engine transport is refused."""
    if setting in ("auto", "object_store"):
        return "object_store"
    why = ("the driver's env runner cannot be called by a remote learner's weight engine: "
           "use num_env_runners >= 1" if receiver.in_driver else
           "LoRA syncs carry the adapter (host copies) through Ray's object store")
    raise ValueError(f"weight_sync_transport={setting!r} for env runner {index}: {why}, or "
                     "weight_sync_transport='auto'.")


def engine_backend(transport: str, group: str = "gloo") -> str:
    """The weight-transfer engine (vLLM's factory name) of a transport; ``group``: the
    group's backend (`group_backend`: ``nccl`` when every rank has a GPU of its own)."""
    engines = {"ipc": "ipc", "shm": "grpo_shm",
               "collective": "nccl" if group == "nccl" else "grpo_gloo",
               "delta": "grpo_sparse_gloo"}  # on GPUs too: see engines.SparseGlooEngine
    if transport not in engines:
        raise ValueError(f"transport {transport!r} has no weight-transfer engine")
    return engines[transport]


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
    if setting == "ipc" and sender.host_payload:
        raise ValueError("weight_sync_transport='ipc' shares CUDA memory, but the payload "
                         "(LoRA) lives in host memory: use 'shm' or 'auto'.")
    if setting == "delta":
        return "collective" if receiver.node_id != sender.node_id else "shm"  # its group
    if setting == "ipc" and not _sees_sender_gpu(sender, receiver):
        raise ValueError(f"weight_sync_transport='ipc' needs the learner's weights on a GPU "
                         f"that {where} sees: use 'shm', 'collective' or 'auto'.")
    return setting


def group_backend(sender: Endpoint, receivers: list[Endpoint], refuse_shared: bool = True
                  ) -> str:
    """NCCL when the sender and every receiver of the group are on GPUs with vLLM's engines,
    each rank on a GPU of its own; else gloo (which does not mind two ranks on one GPU).
    ``refuse_shared`` False: the backend the devices alone would give."""
    on_gpus = sender.device == "cuda" and all(r.device == "cuda" and r.gpu_engines
                                              for r in receivers)
    if on_gpus and refuse_shared and shared_gpus(sender, receivers):
        return "gloo"
    return "nccl" if on_gpus else "gloo"


def predict_transport(config: Any) -> tuple[str, str]:
    """What ``auto`` (or the setting) will pick for ``config`` on one node, and why."""
    setting = getattr(config, "weight_sync_transport", "auto")
    local_learner = config.num_learners == 0
    runners = config.num_env_runners
    if local_learner and runners == 0:
        return "local", "learner and sampler in the driver: device tensors copied in place"
    if setting == "delta":
        return "delta", ("changed elements only (a tensor whole where that is fewer bytes), "
                         "through the grpo_sparse_gloo engine over a gloo group")
    if setting != "auto":
        return setting, "forced by weight_sync_transport"
    learner_gpu = (config.num_gpus_per_learner or 0) > 0
    runner_gpu = (config.num_gpus_per_env_runner or 0) > 0
    sharded = config.num_learners >= 2 and getattr(config, "fsdp", False)
    lora = getattr(config, "lora_rank", 0) > 0
    if lora:
        return "object_store", "LoRA syncs carry the adapter only, through Ray's object store"
    if learner_gpu and runner_gpu:
        gathered = " of the full tensors gathered from the FSDP shards" if sharded else ""
        return "ipc", (f"learner and env runners on one node's GPUs: CUDA IPC handles{gathered} "
                       "(collective NCCL across nodes or GPUs the runner cannot see)")
    why = "LoRA payloads live in host memory: " if lora and learner_gpu and runner_gpu else ""
    return "shm", (f"{why}learner and env runners on one node: buckets through shared memory "
                   "(collective gloo/NCCL buckets across nodes)")
