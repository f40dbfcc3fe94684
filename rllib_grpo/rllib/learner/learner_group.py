"""`GRPOLearnerGroup`: RLlib's learner group for remote GRPO learners (FSDP2 or DDP).

It hands every learner whole prompt groups (each learner's k-th mini-batch is its
share of the global k-th mini-batch) and runs state gathers and checkpoint saves on
*all* learners: RLlib's own group asks learner 0 alone, which would hang in the
collective gather of a sharded model.  Its learners' process group gets the backend the
config needs (`rllib_grpo.rllib.placement.learners_backend`).
"""


from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
from ray.rllib.core import COMPONENT_LEARNER, DEFAULT_MODULE_ID
from ray.rllib.core.learner import learner_group as rllib_learner_group
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_grpo.rllib.learner.distributed import rank
from rllib_grpo.rllib.placement import learners_backend


# --------------------------------------------------------------------------- learner group
def shard_rows(group_index: np.ndarray, num_shards: int, groups_per_minibatch: int,
               ) -> list[np.ndarray]:
    """Row indices for each learner: whole groups, mini-batch aligned.

    Each global mini-batch (``groups_per_minibatch`` consecutive groups) is cut
    into ``num_shards`` equal runs of groups, so learner r's k-th local
    mini-batch is exactly its share of the global k-th one.  When a mini-batch
    does not split into whole groups per learner, the whole step is split.
    """
    groups = list(dict.fromkeys(group_index.tolist()))  # in order of appearance
    block = groups_per_minibatch if groups_per_minibatch % num_shards == 0 else len(groups)
    if len(groups) % block or block % num_shards:
        raise ValueError(f"{len(groups)} groups do not split over {num_shards} learners in "
                         f"mini-batches of {groups_per_minibatch} groups.")
    per_shard = block // num_shards
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for start in range(0, len(groups), block):
        for r in range(num_shards):
            shards[r].extend(groups[start + r * per_shard: start + (r + 1) * per_shard])
    rows = [np.concatenate([np.flatnonzero(group_index == g) for g in s]) for s in shards]
    if len({len(r) for r in rows}) > 1:  # unequal shards would desynchronise collectives
        raise ValueError(f"Groups of unequal size: learners would get {[len(r) for r in rows]} "
                         "rows; every group must have group_size rows.")
    return rows


@contextlib.contextmanager
def torch_backend(backend: str | None) -> Iterator[None]:
    """While RLlib builds a learner group, its Ray Train ``TorchConfig`` gets ``backend``
    (None: RLlib's as it is).  RLlib makes that config in a module function
    (``_get_backend_config``) that takes no backend: it is wrapped for the construction."""
    if backend is None:
        yield
        return
    original = rllib_learner_group._get_backend_config

    def with_backend(learner_class: type) -> Any:
        backend_config = original(learner_class)
        backend_config.backend = backend
        return backend_config

    rllib_learner_group._get_backend_config = with_backend
    try:
        yield
    finally:
        rllib_learner_group._get_backend_config = original


class GRPOLearnerGroup(LearnerGroup):
    """Learner group for remote GRPO learners (FSDP2 or DDP): group-wise sharding, state
    gathers / checkpoint saves that run on every learner, and the process group's backend
    from the config."""

    @override(LearnerGroup)
    def __init__(self, *, config: Any, module_spec: Any = None,
                 placement_group: Any = None) -> None:
        with torch_backend(learners_backend(config)):
            super().__init__(config=config, module_spec=module_spec,
                             placement_group=placement_group)
        executor = getattr(self, "_backend_executor", None)
        if executor is not None:
            # The run's placement group outlives the learners (its env runners and reward
            # workers are in it): Ray Train would remove the group it was given at shutdown.
            executor._placement_group = None

    @override(LearnerGroup)
    def update(self, *, batch: MultiAgentBatch | None = None, **kwargs: Any) -> Any:
        if batch is not None and not self.is_local:
            return super().update(batches=self._shard_batch(batch), **kwargs)
        return super().update(batch=batch, **kwargs)

    def _shard_batch(self, batch: MultiAgentBatch) -> list[MultiAgentBatch]:
        columns = batch.policy_batches[DEFAULT_MODULE_ID]
        plan = self.config.batch_plan()
        rows_per_learner = shard_rows(np.asarray(columns["group_index"]), len(self),
                                      plan.prompts_per_minibatch)
        return [
            MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(
                {k: np.asarray(v)[rows] for k, v in columns.items()})}, env_steps=len(rows))
            for rows in rows_per_learner
        ]

    @override(LearnerGroup)
    def get_state(self, components=None, *, not_components=None, **kwargs: Any) -> dict:
        """Every learner takes part in the (collective) gather; rank 0's result is returned."""
        if self.is_local or not self._check_component(COMPONENT_LEARNER, components,
                                                      not_components):
            return super().get_state(components, not_components=not_components, **kwargs)
        comps = self._get_subcomponents(COMPONENT_LEARNER, components)
        not_comps = self._get_subcomponents(COMPONENT_LEARNER, not_components)
        results = self.foreach_learner(
            lambda learner: (rank(),
                             learner.get_state(comps, not_components=not_comps, **kwargs)))
        by_rank = dict(self._get_results(results))
        return {COMPONENT_LEARNER: by_rank[0]}

    @override(LearnerGroup)
    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's layout; the state is gathered on all learners first (stock saving asks
        learner 0 alone, which would hang in the gather), then learner 0 writes it."""
        if state is None and not self.is_local:
            state = self.get_state()
        return super().save_to_path(path, state=state, filesystem=filesystem,
                                    use_msgpack=use_msgpack)
