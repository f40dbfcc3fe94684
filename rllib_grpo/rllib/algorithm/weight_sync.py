"""`WeightSync`: the learners' weights to every env runner's sampler, by the fastest path the
placement allows (`rllib_grpo.weights.plan` decides, ``weight_sync_transport``
overrides).

* ``local``: the learner's live tensors handed to the sampler in the same process, which
  copies them into its own in place (no host copy, no clone, no numpy).
* ``ipc`` / ``collective`` / ``shm`` / ``delta``: a weight-transfer engine through vLLM's
  API (`rllib_grpo.weights.plan.engine_backend`: vLLM's ``ipc`` / ``nccl`` /
  ``sparse_nccl`` on GPUs, our ``grpo_shm`` / ``grpo_gloo`` / ``grpo_sparse_gloo`` in
  host memory).  The learners' trainer engine (`rllib_grpo.rllib.learner.weight_sender`)
  drives the runners through an `EnvRunnerClient`: init once, then start, update, finish.
  An engine that does not connect within ``weight_sync_connect_timeout_s``, or fails to,
  is the run's error (one line: the runners, the address, what to open), never a quiet
  move to the object store.
* ``object_store``: RLlib's own ``sync_weights`` (a state dict through Ray): for a runner
  whose sampler cannot join an engine, for LoRA payloads (adapter-only) and for the
  driver's own env runner when the learner is remote.

Per sync the driver stages the layout on the learners; for a layout the runners have not
seen it has every runner check it (a partial or foreign state is refused before a byte
moves); then each engine sends.  A runner that restarted (RLlib's restart count moves, or
its engine token is gone) makes the driver connect again.  A runner holds one engine: a
re-plan (after a restart, or `WeightSync.use_transport`) shuts every engine it no longer
uses down on the learners, so none is left with a group whose runners joined another.  Metrics: ``weight_sync/bytes``
(one runner's bytes), ``weight_sync/gbps`` (10^9 bytes per second of the whole sync),
``weight_sync/transport`` (`TRANSPORT_CODES`) and, for delta syncs,
``weight_sync/changed_frac`` (changed elements / all); the runners log their load time.
"""

from __future__ import annotations

import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.rllib.algorithm.weight_client import EnvRunnerClient
from rllib_grpo.rllib.env_runner.env_runner import COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO
from rllib_grpo.rllib.env_runner.weight_receiver import (
    runner_endpoint,
    runner_leave,
    runner_prepare,
)
from rllib_grpo.rllib.learner.weight_sender import (
    learner_close,
    learner_connect,
    learner_disconnect,
    learner_done,
    learner_endpoint,
    learner_local_state,
    learner_send,
    learner_stage,
)
from rllib_grpo.weights.plan import (
    ENGINE_TRANSPORTS,
    GROUP_TRANSPORTS,
    TRANSPORT_CODES,
    WEIGHT_SYNC_TRANSPORTS,
    Endpoint,
    choose_transports,
    engine_backend,
    group_backend,
)

logger = logging.getLogger(__name__)


def _indexed(runner: Any, func: Any) -> tuple[int, Any]:
    return runner.worker_index, func(runner)


# --------------------------------------------------------------------------- the driver
class WeightSync:
    """Driver side of the weight sync of one `GRPO` algorithm (created on its first sync)."""

    def __init__(self, algo: Any) -> None:
        self.algo = algo
        self.setting = algo.config.weight_sync_transport
        self.bucket_bytes = max(1, int(algo.config.weight_sync_bucket_mb * 2**20))
        self.connect_timeout_s = float(algo.config.weight_sync_connect_timeout_s)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="weight_sync")
        self.transports: dict[int, str] = {}  # env runner index -> transport
        self.endpoints: dict[int, Endpoint] = {}
        self.sender: Endpoint | None = None
        self.wire_dtype: torch.dtype | None = None
        self.state_nbytes = 0
        self._members: tuple | None = None
        self.backends: dict[str, list[int]] = {}  # engine backend -> its env runners
        self._tokens: dict[str, str] = {}  # connected engine backend -> its token
        self._prepared: set[tuple] = set()  # (tokens, layout) the runners have checked

    @property
    def runners(self) -> Any:
        return self.algo.env_runner_group

    # ---------------------------------------------------------------- one sync
    def sync(self) -> dict[str, float]:
        """Push the weights everywhere; returns the metrics of this sync."""
        start = time.perf_counter()
        remote = tuple(sorted(self.runners.healthy_worker_ids())) \
            if self.runners.num_remote_env_runners() else ()
        # A restarted runner (fault tolerance) keeps its index but lost its group.
        members = (remote, self.runners.num_remote_worker_restarts() if remote else 0)
        if self._members is None or members != self._members:
            self._discover(remote, members)
        used = set(self.transports.values())
        if not used:  # every remote runner out of service, no local one: nothing to reach
            logger.warning("weight sync: no env runner in service; the weights go to the "
                           "runners once they are back")
            return {"weight_sync/bytes": 0.0, "weight_sync/gbps": 0.0}
        if "object_store" in used:
            nbytes = self._sync_object_store()
            used = {"object_store"}
        changed_frac = None
        if "object_store" not in used:
            nbytes = self._sync_local() if "local" in used else 0
            if used - {"local"}:
                remote_bytes, changed_frac = self._sync_remote()
                nbytes = max(nbytes, remote_bytes)
        seconds = max(time.perf_counter() - start, 1e-9)
        slowest = max(used, key=TRANSPORT_CODES.__getitem__)
        metrics = {"weight_sync/bytes": float(nbytes), "weight_sync/gbps": nbytes / seconds / 1e9,
                   "weight_sync/transport": float(TRANSPORT_CODES[slowest])}
        if changed_frac is not None:
            metrics["weight_sync/changed_frac"] = changed_frac
        return metrics

    def transport_names(self) -> dict[int, str]:
        """The transport of each env runner (0 = the local one), after the first sync."""
        return dict(self.transports)

    def close(self) -> None:
        """Shut the weight group down on every member (the runners, then the learners' side
        with its store) and free the shared memory."""
        connected = sorted({i for b in self._tokens for i in self.backends.get(b, ())})
        if connected:
            self._while_stopping("runners", self._on_runners, connected, runner_leave)
        self._tokens = {}
        self._while_stopping("learners", self._on_learners, learner_close)
        self._pool.shutdown(wait=False)

    @staticmethod
    def _while_stopping(side: str, call: Any, *args: Any) -> None:
        try:
            call(*args)
        except Exception:  # noqa: BLE001 - stopping: the actors may be gone already
            logger.debug("weight sync: closing the %s' side failed", side, exc_info=True)

    # ---------------------------------------------------------------- placement
    def _discover(self, remote: tuple[int, ...], members: tuple) -> None:
        by_rank = {r: (ep, nbytes) for r, ep, nbytes in self._on_learners(learner_endpoint)}
        self.sender, self.state_nbytes = by_rank[0]
        self.endpoints = {}
        if self.runners.local_env_runner is not None:
            self.endpoints[0] = runner_endpoint(self.runners.local_env_runner)
        if remote:
            self.endpoints.update(self._on_runners(remote, runner_endpoint))
        self._members = members
        self._plan(keep_engines=False)  # a runner may have restarted: every engine anew

    def use_transport(self, setting: str) -> None:
        """From the next sync on, ``setting`` (one of ``weight_sync_transport``'s values)
        instead of the configured one, on the runners placed already: engines the new plan
        no longer uses are shut down on the learners (their runners re-join another
        engine), engines it keeps stay connected."""
        if setting not in WEIGHT_SYNC_TRANSPORTS:
            raise ValueError(f"weight sync transport {setting!r}: use one of "
                             f"{', '.join(WEIGHT_SYNC_TRANSPORTS)}")
        self.setting = setting
        if self.sender is not None:
            self._plan(keep_engines=True)

    def _plan(self, keep_engines: bool) -> None:
        """Transports and engine backends for the known endpoints.  A runner holds one
        engine: an engine of the old plan is kept only with ``keep_engines`` and the very
        same runners; every other one is shut down on the learners (its group is gone
        once its runners join another engine, and a send through it would fail)."""
        assert self.sender is not None
        old = self.backends
        self.transports = choose_transports(self.setting, self.sender, self.endpoints)
        self.transports = {i: "object_store" if t != "local" and self.endpoints[i].num_ranks == 0
                           else t for i, t in self.transports.items()}
        dtypes = {ep.dtype for ep in self.endpoints.values() if ep.dtype is not None}
        self.wire_dtype = dtypes.pop() if len(dtypes) == 1 else None
        group_ids = self._ids(*GROUP_TRANSPORTS)
        group = group_backend(self.sender, [self.endpoints[i] for i in group_ids])
        self.backends = {}
        for i in self._ids(*ENGINE_TRANSPORTS):
            backend = engine_backend(self.transports[i], group)
            self.backends.setdefault(backend, []).append(i)
        engine_ids = {i for ids in self.backends.values() for i in ids}
        for backend in list(self._tokens):
            if not keep_engines or old.get(backend) != self.backends.get(backend):
                # Runners placed already that no engine takes now leave theirs (a restarted
                # one, keep_engines=False, has none left).
                self._disconnect(backend, [i for i in old.get(backend, ())
                                           if keep_engines and i not in engine_ids])
        self._prepared = set()
        logger.info("weight sync (%s): %s", self.setting, ", ".join(
            f"env runner {i} -> {t}" for i, t in sorted(self.transports.items())))

    def _disconnect(self, backend: str, leaving: list[int] | tuple[int, ...] = ()) -> None:
        """Forget ``backend``'s engine and shut its trainer side down on the learners (and
        on the runners ``leaving``)."""
        self._tokens.pop(backend, None)
        if leaving:
            self._while_stopping("runners", self._on_runners, leaving, runner_leave)
        self._while_stopping("learners", self._on_learners,
                             partial(learner_disconnect, backend=backend))

    def _ids(self, *transports: str) -> list[int]:
        return sorted(i for i, t in self.transports.items() if t in transports)

    # ---------------------------------------------------------------- the paths
    def _sync_object_store(self) -> int:
        self.runners.sync_weights(from_worker_or_learner_group=self.algo.learner_group,
                                  policies=[DEFAULT_MODULE_ID], inference_only=True)
        return self.state_nbytes

    def _sync_local(self) -> int:
        state, seq_no = self._on_learners(learner_local_state)[0]
        runner = self.runners.local_env_runner
        runner.set_state({COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: state}, WEIGHTS_SEQ_NO: seq_no})
        return int(runner.last_weight_sync.get("bytes", 0))

    def _sync_remote(self) -> tuple[int, float | None]:
        """Every engine's sync; ``(one runner's bytes, changed fraction of a delta sync)``."""
        for backend in self.backends:
            if backend not in self._tokens:
                self._connect(backend)
        staged = self._stage_and_prepare()
        nbytes, changed_frac = staged["manifest"].nbytes, None
        try:
            for backend in self.backends:
                stats = dict(self._on_learners(partial(learner_send, backend=backend)))[0]
                nbytes = int(stats["bytes"])
                if stats["elements"]:
                    changed_frac = stats["changed"] / stats["elements"]
        except Exception:
            self._members = None  # a runner may be gone: look at the placement again
            raise
        finally:
            self._on_learners(learner_done)
        return nbytes, changed_frac

    def _stage_and_prepare(self) -> dict:
        ids = sorted(i for ids in self.backends.values() for i in ids)
        for attempt in range(2):
            staged = dict(self._on_learners(partial(
                learner_stage, wire_dtype=self.wire_dtype, bucket_bytes=self.bucket_bytes)))[0]
            prepared = (tuple(sorted(self._tokens.items())), staged["manifest"].fingerprint)
            if prepared in self._prepared:  # the same layout, already checked
                return staged
            tokens = self._on_runners(ids, partial(runner_prepare, manifest=staged["manifest"]))
            stale = {b for b, members in self.backends.items()
                     if any(tokens[i] != self._tokens.get(b) for i in members)}
            if not stale:
                self._prepared.add(prepared)
                return staged
            # A runner restarted (fault tolerance) and lost its engine: connect again.
            logger.warning("weight sync: env runners of %s are not connected (restarted?); "
                           "connecting again", sorted(stale))
            self._prepared = set()
            if attempt:
                break
            for backend in stale:
                self._connect(backend)
        raise RuntimeError(f"weight sync: env runners of {sorted(stale)} could not connect")

    def _connect(self, backend: str) -> None:
        """Connect ``backend``'s engine (vLLM's ``trainer_init`` on the learners, the
        runners' ``init_weight_transfer_engine``), within ``weight_sync_connect_timeout_s``.
        A failure is the run's error, whatever the setting: with ``auto`` too, the rest of
        the run going through Ray's object store instead (a whole-model file per step for
        a tensor-parallel engine) would be a slowdown nobody chose."""
        members = self.backends[backend]
        offsets, next_rank = {}, 1
        for i in sorted(members):
            offsets[i], next_rank = next_rank, next_rank + max(1, self.endpoints[i].num_ranks)
        handles = self.runners._worker_manager._actors
        token = uuid.uuid4().hex
        client = EnvRunnerClient(backend, {i: handles[i] for i in members}, offsets, token,
                                 nodes=self._node_addresses(members))
        self._tokens.pop(backend, None)
        try:
            self._on_learners(partial(learner_connect, backend=backend, world_size=next_rank,
                                      client=client, timeout_s=self.connect_timeout_s))
        except Exception as error:
            cause = getattr(error, "cause", None) or error  # a remote learner's own error
            if isinstance(cause, TimeoutError):  # one line: who, where, what to open
                raise TimeoutError(str(cause)) from error
            raise RuntimeError(f"weight_sync_transport={self.setting!r}: the {backend} "
                               f"weight engine could not be connected: {cause}") from error
        self._tokens[backend] = token
        logger.info("weight sync: %s engine, %d ranks (buckets of <= %d MB)", backend,
                    next_rank, self.bucket_bytes // 2**20)

    def _node_addresses(self, runners: list[int]) -> dict[int, str]:
        """Each runner's node address (its Ray node id where Ray does not know it)."""
        addresses = {node["NodeID"]: node["NodeManagerAddress"] for node in ray.nodes()}
        return {i: addresses.get(self.endpoints[i].node_id, self.endpoints[i].node_id)
                for i in runners}

    # ---------------------------------------------------------------- calls
    def _on_learners(self, func: Any) -> list:
        group = self.algo.learner_group
        return group._get_results(group.foreach_learner(func))

    def _on_runners(self, ids: list[int] | tuple[int, ...], func: Any) -> dict[int, Any]:
        """``func(runner)`` on the runners ``ids`` (0 = the local one), concurrently."""
        local = self._pool.submit(func, self.runners.local_env_runner) if 0 in ids else None
        remote = [i for i in ids if i != 0]
        results: dict[int, Any] = {}
        try:
            if remote:
                results.update(self.runners.foreach_env_runner(
                    partial(_indexed, func=func), local_env_runner=False,
                    remote_worker_ids=remote))
        finally:
            if local is not None:
                results[0] = local.result()
        missing = sorted(set(ids) - set(results))
        if missing:
            self._members = None  # rediscover at the next sync
            raise RuntimeError(f"weight sync: env runners {missing} did not answer")
        return results
