"""`WeightSync`: the learners' weights to every env runner's sampler, orchestrated by the
driver.  The sampling strategy calls `WeightSync.sync` (`SamplingStrategy.push_weights`);
the driver asks the learners what to send and the runners to receive, through RLlib's
public group calls (``LearnerGroup.foreach_learner``, ``EnvRunnerGroup.foreach_env_runner``):
learners and runners never call each other.  The two sides are
`rllib_grpo.rllib.learner.weight_sender` (the learners offer) and
`rllib_grpo.rllib.env_runner.weight_receiver` (the runners receive).

One sync:

1. **Who is there.**  The healthy remote runners (or the driver's own) and RLlib's count of
   restarts.  When either changed, every learner and runner says where it lives and the
   planner (`rllib_grpo.weights.plan.choose_transports`, the function ``explain`` and
   ``dry-run`` use) picks each runner's transport.
2. **Each transport:**
   ``local``: the learner's live tensors to the sampler in this process;
   ``shm``: the learners write the weights into the node's shared file, then the runners
   read it (`rllib_grpo.weights.shm`);
   ``object_store``: the learners' state dict (or LoRA payload) into Ray's object store,
   which each runner's ``set_state`` loads;
   ``ipc``: chunk by chunk, the learners pack one (every rank's CUDA IPC buffer, merged by
   GPU UUID), then the runners' vLLM engines load it;
   ``nccl``: the learners broadcast while the runners' engines receive: both calls at once
   (the runners' on a thread of the driver).
   Where the GPUs are fake (`rllib_grpo.rllib.placement.fake_gpus`) the planner decides as
   for real ones and the bytes of ``ipc`` and ``nccl`` move by ``shm``, on the CPU.
3. **Deadlines.**  Every call has the run's deadline of its phase (`algo.deadlines`,
   `rllib_grpo.rllib.algorithm.deadlines`: ``step_timeout_factor`` x the phase's median,
   at least ``step_timeout_floor_s``, which alone bounds a first sync; the NCCL group's
   rendezvous has ``weight_sync_connect_timeout_s``, its message naming the bootstrap's
   host and port).  An env runner that dies during a sync (Ray reports it at once) is named in
   one line (index, node, pid, phase, seconds); one past its deadline is named with every
   process's stack written to the trial folder and restarted
   (`ResilientAlgorithm.restart_stuck_runners`).  Either is left out: the sync completes
   for the others, and the runner, back in service with the current weights
   (`ResilientAlgorithm.restore_env_runners`), joins the next sync.  A learner past its
   deadline stops the run with that line and the stack file
   (`ResilientAlgorithm.waiting_on_learners`: a learner mid-sync cannot be restarted
   safely), as does an NCCL broadcast a receiver died in.

Metrics: ``weight_sync/bytes`` (one runner's bytes), ``weight_sync/gbps`` (10^9 bytes per
second of the whole sync), ``weight_sync/transport`` (`TRANSPORT_CODES`: the slowest path
of the sync) and ``fault_tolerance/weight_sync_dropped_receivers`` (runners left out of a
sync so far); the runners log their load time.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.rllib.algorithm.deadlines import label_range
from rllib_grpo.rllib.env_runner.env_runner import COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO
from rllib_grpo.rllib.env_runner.weight_receiver import (
    runner_endpoint,
    runner_init_engine,
    runner_receive_shared,
    runner_update,
)
from rllib_grpo.rllib.learner.weight_sender import (
    learner_close,
    learner_endpoint,
    learner_ipc_next,
    learner_local_state,
    learner_metadata,
    learner_module_state,
    learner_nccl_join,
    learner_nccl_send,
    learner_nccl_unique_id,
    learner_offer_shared,
)
from rllib_grpo.rllib.placement import fake_gpus
from rllib_grpo.weights import gpu
from rllib_grpo.weights.plan import (
    TRANSPORT_CODES,
    VLLM_ENGINES,
    WEIGHT_SYNC_BUCKET_BYTES,
    Endpoint,
    choose_transports,
    transports_summary,
)

logger = logging.getLogger(__name__)
DROPPED_METRIC = "fault_tolerance/weight_sync_dropped_receivers"


def _call(runner: Any, func: Callable[[Any], Any]) -> tuple[int, bool, Any]:
    """``func(runner)`` as ``(index, ok, result or error message)``: a runner's error is
    the driver's to raise, naming the runner (RLlib would log it and take the runner out)."""
    try:
        return runner.worker_index, True, func(runner)
    except Exception as error:  # noqa: BLE001 - raised by the driver
        return runner.worker_index, False, "".join(
            traceback.format_exception_only(type(error), error)).strip()


def _set_state(runner: Any, ref: Any) -> None:
    runner.set_state(ray.get(ref))


def _rank0(answers: list[tuple]) -> tuple:
    """Learner rank 0's answer of ``(rank, ...)`` answers."""
    return min(answers, key=lambda answer: answer[0])


def _tensor_bytes(value: Any, seen: set[tuple] | None = None) -> int:
    """Bytes of the tensors in a state dict or a LoRA payload (nested dicts, dataclasses),
    a tied tensor once (Ray's pickling sends a shared storage once)."""
    seen = set() if seen is None else seen
    if isinstance(value, torch.Tensor):
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape))
        if key in seen:
            return 0
        seen.add(key)
        return value.numel() * value.element_size()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = vars(value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(v, seen) for v in value.values())
    return 0


class WeightSync:
    """The driver's side of the weight syncs of one `GRPO` algorithm (made on its first)."""

    def __init__(self, algo: Any) -> None:
        c = algo.config
        self.algo = algo
        self.setting = c.weight_sync_transport
        self.buffer_bytes = WEIGHT_SYNC_BUCKET_BYTES
        self.fake_gpus = fake_gpus()
        self.transports: dict[int, str] = {}  # env runner index -> transport (0: the driver's)
        self.endpoints: dict[int, Endpoint] = {}
        self.wire_dtype: torch.dtype | None = None
        self.dropped = 0  # runners left out of a sync so far
        self._members: tuple | None = None
        self._joined: set[str] = set()  # vLLM engines joined since the last discovery
        self._stamp = 0  # this driver's sync count: what the shared file is stamped with
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="weight_sync")

    @property
    def runners(self) -> Any:
        return self.algo.env_runner_group

    @property
    def learners(self) -> Any:
        return self.algo.learner_group

    # ---------------------------------------------------------------- one sync
    def sync(self) -> dict[str, float]:
        """Push the learners' weights to every env runner in service; this sync's metrics."""
        start = time.perf_counter()
        if self._current_members() != self._members:
            self._discover()
        if not self.transports:  # every remote runner out of service, no local one
            logger.warning("weight sync: no env runner in service; the weights reach the "
                           "runners when they are back")
            return {"weight_sync/bytes": 0.0, "weight_sync/gbps": 0.0,
                    DROPPED_METRIC: float(self.dropped)}
        self._stamp += 1
        paths = {"local": self._sync_local, "shm": self._sync_shared,
                 "object_store": self._sync_object_store, "ipc": self._sync_ipc,
                 "nccl": self._sync_nccl}
        nbytes = 0
        for transport, ids in self._by_path().items():
            nbytes = max(nbytes, paths[transport](ids))
        seconds = max(time.perf_counter() - start, 1e-9)
        slowest = max(self.transports.values(), key=TRANSPORT_CODES.__getitem__)
        return {"weight_sync/bytes": float(nbytes), "weight_sync/gbps": nbytes / seconds / 1e9,
                "weight_sync/transport": float(TRANSPORT_CODES[slowest]),
                DROPPED_METRIC: float(self.dropped)}

    def transport_names(self) -> dict[int, str]:
        """The transport the planner gave each env runner (0: the driver's), after a sync."""
        return dict(self.transports)

    def close(self) -> None:
        """Close the learners' side (the shared file, the NCCL group)."""
        try:
            self._on_learners(learner_close, "close")
        except Exception:  # noqa: BLE001 - stopping: the actors may be gone already
            logger.debug("weight sync: closing the learners' side failed", exc_info=True)
        self._pool.shutdown(wait=False)

    def _by_path(self) -> dict[str, list[int]]:
        """Runner ids by the path their bytes take (fake GPUs: ``shm`` for vLLM's engines)."""
        paths: dict[str, list[int]] = {}
        for index, transport in sorted(self.transports.items()):
            path = "shm" if self.fake_gpus and transport in VLLM_ENGINES else transport
            paths.setdefault(path, []).append(index)
        return paths

    # ---------------------------------------------------------------- placement
    def _current_members(self) -> tuple:
        remote = tuple(sorted(self.runners.healthy_worker_ids())) \
            if self.runners.num_remote_env_runners() else ()
        return (remote, self.runners.num_remote_worker_restarts() if remote else 0,
                self.runners.local_env_runner is not None)

    def _discover(self) -> None:
        """Where every learner and runner lives, and each runner's transport."""
        members = self._current_members()
        places = sorted(self._on_learners(learner_endpoint, "discover"),
                        key=lambda place: place["rank"])
        first = places[0]
        sender = Endpoint(first["node_id"], first["pid"], first["device"],
                          tuple(g for place in places for g in place["gpus"]),
                          host_payload=first["host_payload"])
        runners = {}
        if self.runners.local_env_runner is not None:
            runners[0] = runner_endpoint(self.runners.local_env_runner)
        runners.update(self._on_runners(members[0], runner_endpoint, "discover"))
        self.endpoints = {i: place["endpoint"] for i, place in runners.items()}
        self.transports = choose_transports(self.setting, sender, self.endpoints)
        dtypes = {place["dtype"] for place in runners.values()}
        self.wire_dtype = dtypes.pop() if len(dtypes) == 1 else None
        for index, transport in self.transports.items():
            built = runners[index]["backend"]
            if transport in VLLM_ENGINES and not self.fake_gpus and built != transport:
                raise RuntimeError(
                    f"weight sync: env runner {index}'s vLLM engine was started for "
                    f"{built or 'no'} weight transfers, but where its processes landed the "
                    f"weights need {transport}: the run is not placed as its placement plan "
                    "says (rllib-grpo dry-run shows the plan)")
        self._joined = set()
        # A runner that did not answer is found again at the next sync.
        self._members = members if set(runners) >= set(members[0]) else None
        logger.info("weight sync (%s): %s", self.setting, transports_summary(self.transports))

    # ---------------------------------------------------------------- the paths
    def _sync_local(self, ids: list[int]) -> int:
        ((state, seq_no),) = self._on_learners(learner_local_state, "local")
        runner = self.runners.local_env_runner
        runner.set_state({COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: state},
                          WEIGHTS_SEQ_NO: seq_no})
        return int(runner.last_weight_sync.get("bytes", 0))

    def _sync_shared(self, ids: list[int]) -> int:
        offers = self._on_learners(partial(learner_offer_shared, wire_dtype=self.wire_dtype,
                                           stamp=self._stamp), "write")
        offer = next(o for o in offers if o is not None)  # rank 0's
        self._on_runners(ids, partial(runner_receive_shared, offer=offer), "read")
        return offer.manifest.nbytes

    def _sync_object_store(self, ids: list[int]) -> int:
        rank0 = _rank0(self._on_learners(learner_module_state, "object store put"))
        state = {COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: rank0[1]}, WEIGHTS_SEQ_NO: rank0[2]}
        if 0 in ids:
            self.runners.local_env_runner.set_state(state)
        remote = [i for i in ids if i]
        if remote:
            self._on_runners(remote, partial(_set_state, ref=ray.put(state)),
                             "object store load")
        return _tensor_bytes(rank0[1])

    def _sync_ipc(self, ids: list[int]) -> int:
        _, metadata, seq_no = _rank0(self._on_learners(
            partial(learner_metadata, wire_dtype=self.wire_dtype), "metadata"))
        if "ipc" not in self._joined:
            infos = dict.fromkeys(ids, gpu.ipc_init_info())
            ids = self._on_runners(ids, partial(runner_init_engine, init_infos=infos,
                                                names=[m[0] for m in metadata]), "join ipc")
            self._joined.add("ipc")
        nbytes, start = 0, True
        while True:
            _, info = _rank0(self._on_learners(partial(
                learner_ipc_next, wire_dtype=self.wire_dtype, buffer_bytes=self.buffer_bytes),
                "pack ipc chunk"))
            if info is None:
                break
            ids = self._on_runners(ids, partial(runner_update, update_info=info, start=start),
                                   "load ipc chunk")
            nbytes += sum(info["tensor_sizes"])
            start = False
        self._on_runners(ids, partial(runner_update, finish_seq_no=seq_no), "finish")
        return nbytes

    def _sync_nccl(self, ids: list[int]) -> int:
        _, metadata, seq_no = _rank0(self._on_learners(
            partial(learner_metadata, wire_dtype=self.wire_dtype), "metadata"))
        if "nccl" not in self._joined:
            self._join_nccl(ids, [m[0] for m in metadata])
        info = gpu.metadata_info(metadata)
        self._both(partial(learner_nccl_send, wire_dtype=self.wire_dtype,
                           buffer_bytes=self.buffer_bytes),
                   ids, partial(runner_update, update_info=info, start=True,
                                finish_seq_no=seq_no), "nccl broadcast")
        return sum(torch.empty((), dtype=d).element_size() * int(torch.Size(s).numel())
                   for _, d, s in metadata)

    def _join_nccl(self, ids: list[int], names: list[str]) -> None:
        """One NCCL group of learner rank 0 and every worker of these runners' engines,
        formed from rank 0's unique id: every member joins at once."""
        (unique_id,) = [u for u in self._on_learners(learner_nccl_unique_id, "nccl id") if u]
        offsets, world = {}, 1
        for index in ids:
            offsets[index], world = world, world + len(self.endpoints[index].gpus)
        infos = {i: gpu.nccl_init_info(unique_id, offsets[i], world, self.buffer_bytes)
                 for i in ids}
        timeout = float(self.algo.config.weight_sync_connect_timeout_s)
        rule = (f"weight_sync_connect_timeout_s: the NCCL group forms through learner 0's "
                f"bootstrap at {gpu.nccl_bootstrap_address(unique_id)}; open TCP from the "
                "engines' nodes to that port and to NCCL's socket ports on the learners' node "
                "(NCCL_SOCKET_IFNAME picks the interface), or set "
                "weight_sync_transport='object_store'")
        self._both(partial(learner_nccl_join, unique_id=unique_id, world_size=world),
                   ids, partial(runner_init_engine, init_infos=infos, names=names), "join nccl",
                   deadline=(timeout, rule))
        self._joined.add("nccl")

    # ---------------------------------------------------------------- calls with deadlines
    def _on_learners(self, func: Callable[[Any], Any], phase: str,
                     deadline: tuple[float, str] | None = None) -> list[Any]:
        """``func`` on every learner within the run's deadline of the phase (or
        ``deadline``: seconds and the rule that set them); a learner's error is the run's,
        and so is a learner past the deadline (`HangError`)."""
        timeout, rule = deadline or (None, None)
        with self.algo.waiting_on_learners(f"weight_sync {phase}", f"weight sync: {phase}",
                                           timeout_s=timeout, rule=rule):
            results = self.learners.foreach_learner(func)
        values = []
        for result in results:
            if not result.ok:
                raise result.get()
            values.append(result.get())
        return values

    def _on_runners(self, ids: Any, func: Callable[[Any], Any], phase: str,
                    deadline: tuple[float, str] | None = None) -> Any:
        """``func`` on the remote runners ``ids`` within the run's deadline of the phase;
        the runners that answered (a list for a list of ids, else ``{index: result}``).
        One that died or passed the deadline is named and left out (one past it is
        restarted); one whose call raised fails the sync, naming it."""
        remote = [i for i in ids if i]
        if not remote:
            return [] if isinstance(ids, list) else {}
        deadlines = self.algo.deadlines
        timeout, rule = deadline or deadlines.timeout_and_rule(f"weight_sync {phase}")
        start = time.perf_counter()
        with deadlines.watch(f"weight_sync {phase}", f"{label_range('env runner', remote)} "
                             f"(weight sync: {phase})", timeout_s=math.inf, record=False):
            answers = self.runners.foreach_env_runner(
                partial(_call, func=func), local_env_runner=False, remote_worker_ids=remote,
                timeout_seconds=timeout)
        results = {}
        for index, ok, value in answers:
            if not ok:
                raise RuntimeError(f"weight sync: {self._runner(index)} failed in "
                                   f"'{phase}': {value}")
            results[index] = value
        elapsed = time.perf_counter() - start
        missing = sorted(set(remote) - set(results))
        if missing:
            self._left_out(missing, phase, elapsed, timeout, rule)
        else:
            deadlines.record(f"weight_sync {phase}", elapsed)
        return [i for i in ids if i in results] if isinstance(ids, list) else results

    def _both(self, learner_func: Callable[[Any], Any], ids: list[int],
              runner_func: Callable[[Any], Any], phase: str,
              deadline: tuple[float, str] | None = None) -> None:
        """The learners' and the runners' side of a collective at once (the runners' on a
        thread), each within the phase's deadline (or ``deadline``)."""
        runners = self._pool.submit(self._on_runners, ids, runner_func, phase, deadline)
        self._on_learners(learner_func, phase, deadline)
        runners.result()

    def _left_out(self, missing: list[int], phase: str, elapsed: float, timeout: float,
                  rule: str) -> None:
        """Runners that did not answer: the dead ones named, the stuck ones restarted."""
        healthy = set(self.runners.healthy_worker_ids())
        for index in (i for i in missing if i not in healthy):
            logger.warning("weight sync: %s died during '%s' (%.1f s in); the sync went on "
                           "without it (RLlib restarts it, and it gets the current weights "
                           "before it samples)", self._runner(index), phase, elapsed)
        stuck = [i for i in missing if i in healthy]
        if stuck:
            self.algo.restart_stuck_runners(stuck, f"the weight sync's '{phase}'", timeout,
                                            rule, then="the sync went on without it")
            self.algo.log_fault_counts()  # this step's result counts the restart
        self.dropped += len(missing)
        self._members = None  # look at who is there again at the next sync

    def _runner(self, index: int) -> str:
        endpoint = self.endpoints.get(index)
        where = f" (node {endpoint.node_id[:12]}, pid {endpoint.pid})" if endpoint else ""
        return f"env runner {index}{where}"
