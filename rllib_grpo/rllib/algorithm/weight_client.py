"""`EnvRunnerClient`: vLLM's ``VLLMWeightSyncClient`` (init, start, update, finish) over env
runner actors, the client a learner's trainer engine drives (vLLM's own or ours).

Like vLLM's ``RayVLLMWeightSyncClient`` it fans every call out to all its runners and blocks
on all of them; unlike it, the runners are separate engines (each of data-parallel index 0),
so the client gives each its own ``rank_offset`` in the group (vLLM's trainer engines put
"the workers" at offset 1, one engine's worth).  The driver builds it and hands it to the
learners (it travels pickled: actor handles and plain numbers).
"""

from __future__ import annotations

from typing import Any

import ray

from rllib_grpo.rllib.env_runner.weight_receiver import (
    runner_finish_update,
    runner_init_engine,
    runner_start_update,
    runner_update_round,
    runner_update_weights,
)
from rllib_grpo.weights.wire import DispatchInit, as_dict


class EnvRunnerClient:
    """Drives the weight-transfer engine ``backend`` on the env runners ``handles`` (by
    runner index); ``rank_offsets``: each runner's first rank in the group; ``nodes``:
    each runner's node address, for errors that name it."""

    def __init__(self, backend: str, handles: dict[int, Any], rank_offsets: dict[int, int],
                 token: str, nodes: dict[int, str] | None = None) -> None:
        self.backend, self.handles, self.rank_offsets, self.token = (
            backend, handles, rank_offsets, token)
        self.nodes = nodes or {}
        self.version = 0  # the weights' sequence number, set by the sender before each sync

    def describe_ranks(self, ranks: list[int] | None = None) -> str:
        """The env runners holding the group ranks ``ranks`` (None: all of this client's),
        with their nodes: ``"env runner 3 (node 10.0.0.5)"``."""
        if ranks is None:
            runners = sorted(self.handles)
        else:
            first_ranks = sorted(self.rank_offsets.items(), key=lambda item: item[1])
            runners = sorted({max((i for i, first in first_ranks if first <= rank),
                                  default=first_ranks[0][0]) for rank in ranks})
        named = [f"{i} (node {self.nodes[i]})" if i in self.nodes else str(i) for i in runners]
        return f"env runner{'s' if len(named) > 1 else ''} {', '.join(named)}"

    def _each(self, func: Any, **kwargs: Any) -> None:
        ray.get([handle.apply.remote(func, **kwargs) for handle in self.handles.values()])

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        calls = []
        for index, handle in self.handles.items():
            info = dict(init_info)
            if "rank_offset" in info:  # one group for all the runners' workers
                info["rank_offset"] = self.rank_offsets[index]
            calls.append(handle.apply.remote(
                runner_init_engine, init_info=as_dict(DispatchInit(self.backend, info)),
                token=self.token))
        ray.get(calls)

    def start_weight_update(self) -> None:
        self._each(runner_start_update)

    def update_weights(self, update_info: dict[str, Any] | list[dict[str, Any]]) -> None:
        if isinstance(update_info, list):
            raise ValueError("EnvRunnerClient: per-rank update lists are not used here")
        self._each(runner_update_weights, update_info=update_info)

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        version = self.version if weight_version is None else int(weight_version)
        self._each(runner_finish_update, seq_no=version)

    def begin_update(self, update_info: dict[str, Any]) -> _PendingRunners:
        """Start, update and finish as one call per runner (our host engines' round,
        `rllib_grpo.weights.trainer._HostTrainerEngine._round`): one round trip per sync;
        the runners block in the transfer until the sender has sent."""
        return _PendingRunners([handle.apply.remote(
            runner_update_round, update_info=update_info, seq_no=self.version)
            for handle in self.handles.values()])


class _PendingRunners:
    """The runners' update calls in flight (`rllib_grpo.weights.trainer.PendingUpdate`'s
    contract over Ray object refs)."""

    def __init__(self, refs: list[Any]) -> None:
        self.refs = refs

    def check(self) -> None:
        ready, _ = ray.wait(self.refs, num_returns=len(self.refs), timeout=0)
        if ready:
            ray.get(ready)

    def result(self) -> None:
        ray.get(self.refs)
