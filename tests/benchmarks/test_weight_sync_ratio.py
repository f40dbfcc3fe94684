"""`benchmarks.weight_sync_ratio` (issue #28's ratio, old path vs the vLLM API in fresh
processes): what it pools and divides, that it refuses a missing checkout, and (slow) one
child process end to end on the tiny model.  No speed thresholds: the machine is shared."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.weight_sync_ratio import format_table, main, run_child, summarise
from tests.conftest import REPO_ROOT


def _record(path: str, syncs: list[float], copies: list[float]) -> dict:
    return {"path": path, "sync_s": syncs, "memcpy_s": copies, "bytes": 1000,
            "transports": {"1": "shm"}}


def test_medians_pool_every_sync_of_a_path_and_the_ratio_is_api_over_old():
    records = [_record("old", [0.30, 0.10, 0.20], [0.05, 0.05, 0.07]),
               _record("api", [0.12, 0.11, 0.13], [0.04, 0.06, 0.05]),
               _record("api", [0.50, 0.14, 0.16], [0.05, 0.05, 0.05]),
               _record("old", [0.25, 0.15, 0.40], [0.06, 0.06, 0.06])]
    out = summarise(records)
    old_sync = statistics.median([0.30, 0.10, 0.20, 0.25, 0.15, 0.40])
    api_sync = statistics.median([0.12, 0.11, 0.13, 0.50, 0.14, 0.16])
    assert out["old"]["sync_ms"] == pytest.approx(1000 * old_sync, rel=1e-12)
    assert out["api"]["sync_ms"] == pytest.approx(1000 * api_sync, rel=1e-12)
    assert out["api/old"] == pytest.approx(api_sync / old_sync, rel=1e-12)
    assert out["old"]["memcpy_ms"] == pytest.approx(1000 * 0.06, rel=1e-12)
    assert out["api"]["per_process_sync_ms"] == pytest.approx([120.0, 160.0], rel=1e-12)
    assert f"**{api_sync / old_sync:.2f}x**" in format_table(out, "float32")


def test_a_missing_old_checkout_is_refused_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--old-root", str(tmp_path)])
    assert exit_.value.code == 2
    assert "git worktree add" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_one_child_process_times_syncs_and_memcpys_from_its_own_checkout():
    from rllib_grpo.models import resolve_model

    record = run_child("api", str(REPO_ROOT), resolve_model("builtin:tiny"), "float32", 2)
    assert record["rllib_grpo"].startswith(str(REPO_ROOT))
    assert record["transports"] == {"1": "shm"} and record["bytes"] > 0
    assert len(record["sync_s"]) == len(record["memcpy_s"]) == 2
    assert all(s > 0 for s in record["sync_s"] + record["memcpy_s"])
