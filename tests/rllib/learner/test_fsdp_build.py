"""How two FSDP learners build their models (`FSDPGRPOLearner._make_module`): each rank
materialises only its shards (rank 0 loads the weights in host memory, the other ranks
build on the meta device, and rank 0 sends each rank its rows), and a host-offloaded
reference holds this rank's shard only.  Two processes of their own (gloo on CPU, no Ray,
`tests/helpers/fsdp_build_check.py`), every allocation of the build recorded."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT

HELPER = REPO_ROOT / "tests" / "helpers" / "fsdp_build_check.py"

pytestmark = pytest.mark.processes

def _half(model: dict) -> int:
    """The elements of the larger half of each parameter's rows (a rank's most)."""
    return sum(-(-shape[0] // 2) * (math.prod(shape) // shape[0]) for shape in model["shapes"])


@pytest.fixture(scope="module")
def ranks() -> list[dict]:
    """Both ranks' reports of one build with a host-offloaded reference (KL on)."""
    spec = {"training": {"use_kl_loss": True, "ref_param_offload": True}}
    done = subprocess.run([sys.executable, str(HELPER), json.dumps(spec)], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_only_rank_0_holds_the_full_weights_and_no_rank_puts_them_on_its_device(ranks):
    zero, one = ranks
    # Rank 1 builds the structure alone and receives its rows: no full parameter anywhere.
    assert one["built_on"] == ["meta"]
    assert one["full_tensors"] == []
    # Rank 0's one host copy (the load, and the reference copied from it) is all it holds
    # in full; sharding and filling allocate shards only.
    assert zero["built_on"] == ["cpu"]
    assert [t for t in zero["full_tensors"] if t[0] == "shard"] == []
    for name in ("policy", "reference"):
        shares = [report[name]["local_numel"] for report in ranks]
        assert all(report[name]["sharded"] for report in ranks)
        assert sum(shares) == zero[name]["total_numel"] and max(shares) <= _half(zero[name])
    # The shards hold the folder's weights exactly.
    assert zero["weights_match"] == {"policy": True, "reference": True}


def test_the_offloaded_reference_holds_this_ranks_shard_in_host_memory(ranks):
    for report in ranks:
        assert not report["host_ref"]  # no full copy per learner
        assert report["offload"] == {"policy": "OffloadPolicy", "reference": "CPUOffloadPolicy"}
        assert report["reference"]["devices"] == ["cpu"]
    shares = [report["reference"]["local_numel"] for report in ranks]
    reference = ranks[0]["reference"]
    assert sum(shares) == reference["total_numel"] and max(shares) <= _half(reference)
    # Its pass: the folder's model's log-probs (the same float32 operations on the same
    # weights, bit for bit: `weights_match`), and the reference is all shards again after
    # it (FSDP2 keeps a root unit gathered after a forward: embeddings and head).
    assert ranks[0]["reference_diff"] == 0.0
    assert all(report["reference_resharded"] for report in ranks)
