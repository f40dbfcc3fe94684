"""`WeightSync`: the learners' weights to every env runner's sampler, by the fastest path the
placement allows (`rllib_grpo.weights.plan` decides, ``weight_sync_transport``
overrides).

* ``local``: the learner's live tensors handed to the sampler in the same process, which
  copies them into its own in place (no host copy, no clone, no numpy).
* ``ipc``: CUDA IPC handles of the learner's tensors; each runner copies from them.
* ``shm`` / ``collective``: a weight group (learner rank 0 = rank 0, every vLLM worker or
  transformers sampler one rank) streams fixed-size buckets in the sampler's dtype, through
  shared memory on one node or by broadcast (gloo / NCCL) across nodes
  (`rllib_grpo.weights.transport`); with FSDP each bucket is gathered from the shards.
* ``object_store``: RLlib's own ``sync_weights`` (a state dict through Ray), the fallback
  where no group can be formed or a sampler cannot join one.

Per sync the driver stages the sync on the learners (the bucket layout); for a layout the
runners have not seen it has every runner check it (a partial or foreign state is refused
before a byte moves) and map the slots; then it runs the learners' send and the runners'
receive together.  A runner that restarted (RLlib's restart count moves) or left makes
the driver look at the placement again and form a new group.  Metrics: ``weight_sync/bytes``
(one runner's bytes), ``weight_sync/gbps`` (10^9 bytes per second of the whole sync) and
``weight_sync/transport`` (`TRANSPORT_CODES`); the runners log their own load time.

This module is the driver only.  Each learner's side:
`rllib_grpo.rllib.learner.weight_sender` (the ``learner_*`` calls); each env runner's:
`rllib_grpo.rllib.env_runner.weight_receiver` (the ``runner_*`` calls, on the sampler's
`rllib_grpo.weights.receiver.WeightReceiver`).
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.rllib.env_runner.env_runner import COMPONENT_RL_MODULE, WEIGHTS_SEQ_NO
from rllib_grpo.rllib.env_runner.weight_receiver import (
    runner_endpoint,
    runner_join,
    runner_leave,
    runner_prepare,
    runner_receive,
)
from rllib_grpo.rllib.learner.weight_sender import (
    learner_close,
    learner_done,
    learner_endpoint,
    learner_join_group,
    learner_local_state,
    learner_open_group,
    learner_send,
    learner_stage,
)
from rllib_grpo.weights.plan import (
    GROUP_TRANSPORTS,
    TRANSPORT_CODES,
    Endpoint,
    choose_transports,
    group_backend,
)

logger = logging.getLogger(__name__)
GROUP_TIMEOUT_S = 300.0


def _indexed(runner: Any, func: Any) -> tuple[int, Any]:
    return runner.worker_index, func(runner)


# --------------------------------------------------------------------------- the driver
class WeightSync:
    """Driver side of the weight sync of one `GRPO` algorithm (created on its first sync)."""

    def __init__(self, algo: Any) -> None:
        self.algo = algo
        self.setting = algo.config.weight_sync_transport
        self.bucket_bytes = max(1, int(algo.config.weight_sync_bucket_mb * 2**20))
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="weight_sync")
        self.transports: dict[int, str] = {}  # env runner index -> transport
        self.endpoints: dict[int, Endpoint] = {}
        self.sender: Endpoint | None = None
        self.wire_dtype: torch.dtype | None = None
        self.state_nbytes = 0
        self._members: tuple | None = None
        self._token: str | None = None
        self._prepared: set[tuple] = set()  # (group, layout, path) the runners have checked

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
        if "object_store" in used:
            nbytes = self._sync_object_store()
            used = {"object_store"}
        else:
            nbytes = self._sync_local() if "local" in used else 0
            if used - {"local"}:
                nbytes = max(nbytes, self._sync_remote())
        seconds = max(time.perf_counter() - start, 1e-9)
        slowest = max(used, key=TRANSPORT_CODES.__getitem__)
        return {"weight_sync/bytes": float(nbytes), "weight_sync/gbps": nbytes / seconds / 1e9,
                "weight_sync/transport": float(TRANSPORT_CODES[slowest])}

    def transport_names(self) -> dict[int, str]:
        """The transport of each env runner (0 = the local one), after the first sync."""
        return dict(self.transports)

    def close(self) -> None:
        """Shut the weight group down on every member (the runners, then the learners' side
        with its store) and free the shared memory."""
        if self._token is not None:
            self._while_stopping("runners", self._on_runners, self._ids(*GROUP_TRANSPORTS),
                                 runner_leave)
            self._token = None
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
        self.transports = choose_transports(self.setting, self.sender, self.endpoints)
        self.transports = {i: "object_store" if t != "local" and self.endpoints[i].num_ranks == 0
                           else t for i, t in self.transports.items()}
        dtypes = {ep.dtype for ep in self.endpoints.values() if ep.dtype is not None}
        self.wire_dtype = dtypes.pop() if len(dtypes) == 1 else None
        self._members, self._token, self._prepared = members, None, set()
        logger.info("weight sync (%s): %s", self.setting, ", ".join(
            f"env runner {i} -> {t}" for i, t in sorted(self.transports.items())))

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

    def _sync_remote(self) -> int:
        group_ids, ipc_ids = self._ids(*GROUP_TRANSPORTS), self._ids("ipc")
        via = self.transports[group_ids[0]] if group_ids else ""  # "": no group
        if group_ids and self._token is None and not self._form_group(group_ids, via):
            return self._sync_object_store()
        staged = self._stage_and_prepare(group_ids, ipc_ids, via)
        manifest, seq_no = staged["manifest"], staged["seq_no"]
        if ipc_ids:
            self._on_runners(ipc_ids, partial(runner_receive, manifest=manifest, via="ipc",
                                              ipc=staged["ipc"], seq_no=seq_no))
        if group_ids:
            sending = self._pool.submit(self._on_learners, partial(learner_send, via=via))
            try:
                self._on_runners(group_ids, partial(runner_receive, manifest=manifest, via=via,
                                                    ipc=None, seq_no=seq_no))
            finally:
                sending.result()
        if ipc_ids:
            # Each runner synchronized its copies before returning: the shared tensors (with
            # FSDP the whole gathered model on rank 0) can go.
            self._on_learners(learner_done)
        return manifest.nbytes

    def _stage_and_prepare(self, group_ids: list[int], ipc_ids: list[int], via: str
                           ) -> dict:
        for attempt in range(2):
            staged = dict(self._on_learners(partial(
                learner_stage, wire_dtype=self.wire_dtype, bucket_bytes=self.bucket_bytes,
                vias=tuple(v for v in (via, "ipc" if ipc_ids else None) if v))))[0]
            prepared = (self._token, staged["manifest"].fingerprint, via, bool(ipc_ids))
            if prepared in self._prepared:  # the same layout, already checked and mapped
                return staged
            tokens = self._on_runners(group_ids + ipc_ids, partial(
                runner_prepare, manifest=staged["manifest"], slots=staged["slots"]))
            stale = [i for i in group_ids if tokens[i] != self._token]
            if not stale:
                self._prepared.add(prepared)
                return staged
            # A runner restarted (fault tolerance) and lost its group: form it again.
            logger.warning("weight sync: env runners %s are not in the weight group (restarted?)"
                           "; forming it again", stale)
            self._prepared = set()
            if attempt or not self._form_group(group_ids, via):
                break
        raise RuntimeError(f"weight sync: env runners {stale} could not join the weight group")

    def _form_group(self, group_ids: list[int], via: str) -> bool:
        """Form the weight group; False (``auto``: use the object store) if it cannot be."""
        members = {i: self.endpoints[i] for i in group_ids}
        ranks, next_rank = {}, 1
        for i in sorted(members):
            ranks[i], next_rank = next_rank, next_rank + max(1, members[i].num_ranks)
        # Shared memory needs only host-side barriers: gloo, whatever the devices.
        assert self.sender is not None  # set by _discover
        backend = "gloo" if via == "shm" else group_backend(self.sender, list(members.values()))
        try:
            spec = dict(self._on_learners(partial(
                learner_open_group, world_size=next_rank, backend=backend,
                timeout_s=GROUP_TIMEOUT_S)))[0]
            joining = self._pool.submit(self._on_learners, partial(learner_join_group, spec=spec))
            try:
                self._on_runners(group_ids, partial(runner_join, spec=spec, ranks=ranks))
            finally:
                joining.result()
        except Exception as error:
            if self.setting != "auto":
                raise RuntimeError(f"weight_sync_transport={self.setting!r}: the weight group "
                                   f"({backend}) could not be formed: {error}") from error
            logger.warning("weight sync: no %s weight group could be formed (%s); the weights "
                           "go through Ray's object store from now on", backend, error)
            self.transports = {i: "object_store" if t != "local" else t
                               for i, t in self.transports.items()}
            return False
        self._token = spec.token
        logger.info("weight sync: %s group of %d ranks (%s buckets of <= %d MB)", backend,
                    next_rank, via, self.bucket_bytes // 2**20)
        return True

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
