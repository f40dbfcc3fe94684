"""The run's placement group: the config's `PlacementPlan` bound to Ray's bundles, and the
Ray options that put every process in its seat.

Under Tune the trial's placement group is the plan's already (`GRPO.default_resource_request`
returns its bundles).  Built in a driver (``config.build_algo()``), a run whose plan uses
GPUs creates the same placement group itself, waits for it with a deadline, and removes it
when the algorithm stops.  A CPU-only run built in a driver needs none: Ray's scheduling of
whole CPUs has no best fit to get wrong.

Each env runner, engine shard, evaluation env runner and reward worker is created with the
index of its bundle (`RunPlacement.options`): RLlib's own env runner group is swapped for one
that does so while the algorithm sets up (`RunPlacement.env_runner_groups`).  The learners
are Ray Train workers, which Ray puts in any bundle with room; created after the reward
workers, the env runners and their engines' workers (RLlib's order), they find exactly one
GPU bundle with room each (colocated, one learner fills a GPU bundle whatever the order),
and `check_learners` confirms it after they start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Iterator
from typing import Any

import ray
from ray.rllib.algorithms import algorithm as rllib_algorithm
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.utils.annotations import override
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rllib_grpo.rllib.config.gpu_layout import (
    ENV_RUNNER,
    EVAL_RUNNER,
    LEARNER,
    PlacementPlan,
    Seat,
    unplaceable,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RunPlacement:
    """A plan and the placement group it is bound to (``owned``: made by this run, removed
    by `close`)."""

    plan: PlacementPlan
    group: PlacementGroup
    owned: bool = False

    @classmethod
    def start(cls, config: Any, timeout_s: float) -> RunPlacement | None:
        """The run's placement: the current placement group (a Tune trial's) bound to the
        config's plan, else a new one where the plan uses GPUs; None for a CPU-only run
        outside a placement group.  Raises RuntimeError, naming what does not fit, when
        Ray cannot place the group within ``timeout_s``."""
        plan = config.placement_plan()
        group = ray.util.get_current_placement_group()
        if group is not None:
            if len(group.bundle_specs) != len(plan.bundles):
                raise RuntimeError(
                    f"the trial's placement group has {len(group.bundle_specs)} bundles, but "
                    f"GRPO's placement plan has {len(plan.bundles)}: give Tune the GRPO "
                    "trainable itself (its default_resource_request), not one wrapped with "
                    "tune.with_resources.")
            return cls(plan, group).bound()
        if not plan.uses_gpus:
            return None
        group = placement_group(plan.bundle_specs(), strategy=plan.strategy)
        run = cls(plan, group, owned=True)
        ready, _ = ray.wait([group.ready()], timeout=timeout_s)
        if not ready:
            run.close()
            raise RuntimeError(placement_timeout_message(plan, timeout_s))
        return run.bound()

    def bound(self) -> RunPlacement:
        """The plan rebound to the nodes Ray placed the bundles on (TP groups per node)."""
        nodes = placement_group_table(self.group)["bundles_to_node_id"]
        self.plan = self.plan.rebind([nodes[i] for i in range(len(self.plan.bundles))])
        return self

    def options(self, seat: Seat, environment: dict[str, str] | None = None) -> dict[str, Any]:
        """Ray actor options that put a process in ``seat``."""
        options: dict[str, Any] = {
            "num_cpus": seat.cpus, "num_gpus": seat.gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                self.group, placement_group_bundle_index=seat.bundle,
                # An engine's Ray workers (vLLM finds the group as the current one).
                placement_group_capture_child_tasks=True)}
        if seat.custom:
            options["resources"] = dict(seat.custom)
        if environment:
            options["runtime_env"] = {"env_vars": dict(environment)}
        return options

    def engine_environment(self, worker_index: int) -> dict[str, str]:
        """What env runner ``worker_index``'s engine of TP > 1 needs to put its workers on
        their GPUs: vLLM's Ray executor reads the bundles and the share of a GPU of each
        worker from these variables.  Empty for an engine of TP 1 (it runs in the env
        runner's own process, on the env runner's GPU)."""
        shards = self.plan.engine_shards(worker_index)
        if not shards:
            return {}
        return {"VLLM_RAY_BUNDLE_INDICES": ",".join(str(s.bundle) for s in shards),
                "VLLM_RAY_PER_WORKER_GPUS": f"{shards[0].gpus:g}"}

    @contextlib.contextmanager
    def env_runner_groups(self) -> Iterator[None]:
        """While the algorithm sets up, its env runner groups place every remote env runner
        in its seat (RLlib builds its `EnvRunnerGroup` by that module name)."""
        original = rllib_algorithm.EnvRunnerGroup
        rllib_algorithm.EnvRunnerGroup = placed_env_runner_group(self)
        try:
            yield
        finally:
            rllib_algorithm.EnvRunnerGroup = original

    def check_learners(self, learner_group: Any) -> list[dict[str, Any]]:
        """Where each remote learner landed (`whereabouts`, by rank); raises RuntimeError
        when two learners hold one GPU or a learner holds another GPU count than planned."""
        if learner_group.is_local:
            return []
        from rllib_grpo.rllib.learner.distributed import rank
        from rllib_grpo.rllib.placement import whereabouts

        found = learner_group._get_results(learner_group.foreach_learner(
            lambda _: (rank(), whereabouts())))
        places = [where for _, where in sorted(found, key=lambda item: item[0])]
        planned = self.plan.seats_of(LEARNER)
        gpus = [(p["node_id"], g) for p in places for g in p["gpu_ids"]]
        if len(set(gpus)) != len(gpus) or any(
                bool(p["gpu_ids"]) != bool(s.gpus) for p, s in zip(places, planned, strict=True)):
            raise RuntimeError(f"the learners were not placed as planned (one GPU each): {places}")
        return places

    def close(self) -> None:
        """Remove the placement group if this run made it."""
        if self.owned:
            with contextlib.suppress(Exception):
                remove_placement_group(self.group)
            self.owned = False


def placed_env_runner_group(placement: RunPlacement) -> type[EnvRunnerGroup]:
    """RLlib's `EnvRunnerGroup`, placing each remote env runner in its seat of
    ``placement`` (with its engine's environment) instead of at RLlib's bundle offset."""

    class PlacedEnvRunnerGroup(EnvRunnerGroup):
        @override(EnvRunnerGroup)
        def _make_worker(self, *, env_creator: Any, validate_env: Any, worker_index: int,
                         num_workers: int, recreated_worker: bool = False, config: Any,
                         spaces: Any = None) -> Any:
            if worker_index == 0:
                return super()._make_worker(
                    env_creator=env_creator, validate_env=validate_env, worker_index=0,
                    num_workers=num_workers, recreated_worker=recreated_worker, config=config,
                    spaces=spaces)
            evaluation = bool(getattr(config, "in_evaluation", False))
            seat = placement.plan.seat(EVAL_RUNNER if evaluation else ENV_RUNNER, worker_index)
            environment = {} if evaluation else placement.engine_environment(worker_index)
            options = placement.options(seat, environment)
            return ray.remote(max_restarts=self._remote_args["max_restarts"], **options)(
                self.env_runner_cls).remote(
                    env_creator=env_creator, validate_env=validate_env,
                    default_policy_class=self._policy_class, config=config,
                    worker_index=worker_index, num_workers=num_workers,
                    recreated_worker=recreated_worker, log_dir=self._logdir, spaces=spaces,
                    dataset_shards=self._ds_shards, tune_trial_id=self._tune_trial_id)

    return PlacedEnvRunnerGroup


def placement_timeout_message(plan: PlacementPlan, timeout_s: float) -> str:
    """Why a placement group waited past its deadline: what of the plan the cluster
    cannot hold now (`unplaceable`), with each node's free resources."""
    free = [dict(node) for node in _available_per_node()]
    why = unplaceable(plan, free) or "Ray has not placed it (the cluster may still be growing)"
    return (f"the run's placement group ({len(plan.bundles)} bundles: "
            f"{', '.join(_short(b) for b in plan.bundle_specs())}) was not placed within "
            f"{timeout_s:g} s: {why}. Free the resources, grow the cluster, or make the run "
            "smaller (num_learners, num_env_runners, their GPUs).")


def _short(spec: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in spec.items()) + "}"


def _available_per_node() -> list[dict[str, float]]:
    """Each live node's free CPU and GPU now."""
    available = ray._private.state.available_resources_per_node()
    return [{k: float(v) for k, v in resources.items() if k in ("CPU", "GPU")}
            for resources in available.values()]


def wait_started(refs: list[Any], what: str, timeout_s: float) -> list[Any]:
    """``ray.get(refs)`` with a deadline: RuntimeError naming ``what`` on expiry."""
    start = time.monotonic()
    _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if pending:
        raise RuntimeError(f"{len(pending)} of {len(refs)} {what} did not start within "
                           f"{time.monotonic() - start:.0f} s")
    return ray.get(refs)
