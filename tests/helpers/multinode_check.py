"""Run by tests/rllib/algorithm/test_multinode.py in a subprocess: a simulated 2-node Ray cluster
(plus a head) on one machine, learner on one node, env runner on the other."""

from __future__ import annotations

import json
import os
import sys

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 150 * 1024**2})
    cluster.add_node(num_cpus=1, resources={"learner_node": 1},
                     object_store_memory=150 * 1024**2)
    cluster.add_node(num_cpus=1, resources={"sampler_node": 1},
                     object_store_memory=150 * 1024**2)
    ray.init(address=cluster.address)  # what RAY_ADDRESS does on a real cluster
    from tests.conftest import tiny_config

    config = tiny_config()
    config.env_runners(num_env_runners=1, create_local_env_runner=False,
                       custom_resources_per_env_runner={"sampler_node": 1})
    config.learners(num_learners=1, custom_resources_per_learner={"learner_node": 1})
    algo = config.build_algo()
    node = lambda *_: ray.get_runtime_context().get_node_id()  # noqa: E731
    learner_nodes = algo.learner_group.foreach_learner(node)
    learner_nodes = [r.get() if hasattr(r, "get") else r for r in learner_nodes]
    runner_nodes = algo.env_runner_group.foreach_env_runner(node, local_env_runner=False)
    results = [algo.train() for _ in range(2)]
    out = {
        "driver_node": ray.get_runtime_context().get_node_id(),
        "learner_nodes": learner_nodes,
        "runner_nodes": runner_nodes,
        "rollout_log_probs_diff_max": [r["training/rollout_log_probs_diff_max"] for r in results],
        "weight_bytes": results[-1]["env_runners"].get("weight_sync/bytes"),
        "transports": algo._weight_sync.transport_names(),
        "num_nodes": len(ray.nodes()),
    }
    algo.stop()
    print("RESULT " + json.dumps(out))
    ray.shutdown()
    cluster.shutdown()


if __name__ == "__main__":
    main()
