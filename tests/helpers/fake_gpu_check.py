"""GRPO runs on a local Ray cluster that only declares GPUs (the fake-GPU test bed), in a
process of their own: ``python tests/helpers/fake_gpu_check.py SPEC_JSON`` prints one line
``RESULT <json>``.

SPEC: ``{"nodes": N, "gpus_per_node": G, "runs": [RUN, ...]}``, the runs one after another on
the same cluster; a RUN is ``{"layout": LAYOUT, "how": "build" | "tune" | "stand-ins"}``:

* ``build``: ``config.build_algo()``, one training step; where every process landed, the
  weight transport of each env runner the run used and the one ``explain`` prints;
* ``tune``: the same as a Tune trial (its placement group from ``default_resource_request``),
  the places recorded by an ``on_algorithm_init`` callback, the transports by
  ``on_train_result``;
* ``stand-ins``: the placement alone, with `rllib_grpo.cli.dry_run.place_stand_ins` (its
  problems include a weight transport, as placed, other than the plan's).

LAYOUT: ``{"colocate": n, "tp": t}`` (verl's layout) or ``{"learners": n, "engines": e,
"tp": t}`` (GPUs of their own), plus ``"reward_gpus": g`` for a reward model on actors and
``"learners_first": true`` (stand-ins: the learners placed before the rest).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def make_config(layout: dict[str, Any]) -> Any:
    from tests.conftest import tiny_config

    tp = int(layout.get("tp", 1))
    learners = int(layout.get("colocate") or layout["learners"])
    runners = learners // tp if layout.get("colocate") else int(layout["engines"])
    extra: dict[str, Any] = {}
    if layout.get("reward_gpus") is not None:
        extra.update(reward_model_enable=True, reward_model_path="builtin:tiny-rm",
                     num_gpus_per_reward_worker=float(layout["reward_gpus"]))
    config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp},
                         prompts_per_step=learners * runners, group_size=2,
                         max_response_length=2, startup_timeout_s=90, **extra)
    if layout.get("colocate"):
        return config.colocate(learners)
    config.learners(num_learners=learners, num_gpus_per_learner=1)
    return config.env_runners(num_env_runners=runners, num_gpus_per_env_runner=tp)


def _places(algo: Any) -> dict[str, Any]:
    """Where the algorithm's processes landed, from inside each."""
    from rllib_grpo.rllib.placement import whereabouts

    runners = algo.env_runner_group.foreach_env_runner(
        lambda runner: (runner.worker_index, runner.placement_report()), local_env_runner=False)
    rewards = []
    if algo._reward_actors is not None:
        import ray

        handles = [h for pool in algo._reward_actors.actors.values() for h in pool]
        rewards = ray.get([h.__ray_call__.remote(lambda _self: whereabouts()) for h in handles])
    return {"env_runners": dict(runners),
            "learners": algo._placement.check_learners(algo.learner_group),
            "reward_workers": rewards,
            "bundles": algo._placement.plan.bundle_specs()}


def _transports(algo: Any) -> dict[str, Any]:
    """The transport each env runner's weights took in the run, and the one ``explain``
    prints (`planned_transports`: the same planner, on the placement plan's places)."""
    from rllib_grpo.rllib.config.gpu_layout import planned_transports

    return {"transports": algo._weight_sync.transport_names(),
            "planned": planned_transports(algo.config, algo.config.placement_plan())}


def record_places(path: str, algorithm: Any, **_: Any) -> None:
    """RLlib callback (``on_algorithm_init``, ``path`` bound): the places, to ``path``."""
    with open(path, "w") as file:
        json.dump(_places(algorithm), file)


def record_transports(path: str, algorithm: Any, **_: Any) -> None:
    """RLlib callback (``on_train_result``, ``path`` bound): `_transports`, to ``path``."""
    with open(path, "w") as file:
        json.dump(_transports(algorithm), file)


def run(layout: dict[str, Any], how: str) -> dict[str, Any]:
    config = make_config(layout)
    start = time.perf_counter()
    if how == "stand-ins":
        from rllib_grpo.cli.dry_run import check_places, place_stand_ins

        placement, placed = place_stand_ins(config,
                                            learners_first=bool(layout.get("learners_first")))
        placement.close()
        return {"placed": [dataclasses.asdict(p) for p in placed],
                "problems": check_places(config, placed),
                "seconds": time.perf_counter() - start}
    if how == "build":
        algo = config.build_algo()
        built = time.perf_counter() - start
        try:
            places = _places(algo)
            result = algo.train()
            transports = _transports(algo)
        finally:
            algo.stop()
        return {**places, **transports, "built_s": built,
                "iterations": result["training_iteration"],
                "reward": result.get("critic/score/mean")}
    from ray import tune

    from rllib_grpo.rllib.algorithm.grpo import GRPO

    places_file, transports_file = tempfile.mktemp(suffix=".json"), tempfile.mktemp(".json")
    config.callbacks(on_algorithm_init=functools.partial(record_places, places_file),
                     on_train_result=functools.partial(record_transports, transports_file))
    grid = tune.Tuner(GRPO, param_space=config, run_config=tune.RunConfig(
        stop={"training_iteration": 1}, storage_path=tempfile.mkdtemp(), verbose=0,
        failure_config=tune.FailureConfig(max_failures=0))).fit()
    result = grid[0]
    if result.error is not None:
        raise result.error
    with open(places_file) as file:
        places = json.load(file)
    with open(transports_file) as file:
        places.update(json.load(file))
    return {**places, "iterations": result.metrics["training_iteration"],
            "built_s": time.perf_counter() - start}


def main() -> None:
    spec = json.loads(sys.argv[1])
    from rllib_grpo.cli.dry_run import fake_gpu_cluster

    outcomes = []
    with fake_gpu_cluster(spec["nodes"], spec["gpus_per_node"], spec.get("cpus_per_node", 8)):
        import ray

        node_ids = [node["NodeID"] for node in ray.nodes()]
        for item in spec["runs"]:
            outcomes.append(run(item["layout"], item["how"]))
    print("RESULT " + json.dumps({"nodes": node_ids, "runs": outcomes}), flush=True)


if __name__ == "__main__":
    main()
