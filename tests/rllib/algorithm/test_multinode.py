"""Multi-node placement, simulated: 3 Ray nodes on one machine (`ray.cluster_utils.Cluster`)
with custom resources.  The learner and the env runner land on different nodes, an iteration
completes, and the sampler holds the learner's weights (its log-probs match the learner's).

Slow (~65 s in CI: a 3-node cluster and two actors in a subprocess): `make test-slow`.  The
default suite covers its parts on one node: syncs to remote env runners
(`test_weight_sync.py`, `test_weight_sync_faults.py`) and the placement bundles of env
runners and learners (`tests/rllib/config/test_resources.py`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT


@pytest.mark.slow
def test_learner_and_env_runner_on_different_nodes_with_synced_weights():
    proc = subprocess.run([sys.executable, "tests/helpers/multinode_check.py"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT "):])
    assert out["num_nodes"] == 3
    (learner_node,) = out["learner_nodes"]
    (runner_node,) = out["runner_nodes"]
    assert len({learner_node, runner_node, out["driver_node"]}) == 3
    # Second iteration samples with the weights synced after the first update.
    assert out["rollout_log_probs_diff_max"][1] < 1e-5
    assert out["weight_bytes"] > 0
    assert out["transports"] == {"1": "object_store"}  # CPUs on another node
