"""Run by tests/rllib/test_stacks.py in a subprocess: a simulated 2-node Ray cluster on one
machine, a registered actor stuck on the node the driver is not on; the driver gathers the
run's stacks (the other node's through a task pinned there)."""

from __future__ import annotations

import json
import os
import sys
import time

import ray
from ray.cluster_utils import Cluster

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main() -> None:
    from rllib_grpo.rllib import stacks
    from tests.helpers.stuck_worker import StuckWorker

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "object_store_memory": 100 * 1024**2, "include_dashboard": False})
    cluster.add_node(num_cpus=1, resources={"other_node": 1},
                     object_store_memory=100 * 1024**2)
    ray.init(address=cluster.address)
    run_id = "multinode-stacks"
    try:
        actor = ray.remote(StuckWorker).options(num_cpus=0, resources={"other_node": 1}).remote(
            run_id)
        ray.get(actor.child_pid.remote())
        actor.wait_forever.remote()
        stacks.enable_stack_dumps(run_id, "algorithm (driver)")
        time.sleep(1.0)
        cards, problems = stacks.gather_stacks(run_id)
        here = ray.get_runtime_context().get_node_id()
        print("RESULT " + json.dumps({
            "driver_node": here, "problems": problems,
            "cards": [{"roles": c["roles"], "node_id": c["node_id"], "stacks": c["stacks"]}
                      for c in cards]}))
        ray.kill(actor)
    finally:
        stacks.forget_run(run_id)
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
