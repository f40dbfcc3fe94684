"""The benchmark harness on the tiny model: every phase reported, times that add up.

Sanity checks only, no speed thresholds: CI machines are shared and noisy.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.common import OVERHEAD_PARTS, PHASES
from benchmarks.harness import main
from tests.conftest import REPO_ROOT

# The harness builds the algorithm: a Ray of its own.
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "tiny.json"
    code = main(["--model", "builtin:tiny", "--prompts", "4", "--group-size", "4",
                 "--response-length", "8", "--iterations", "2", "--warmup", "1",
                 "--sampler", "hf", "--old-log-prob-pass", "--json", str(out), "--keep-records"])
    assert code == 0
    return json.loads(out.read_text())


@pytest.mark.timeout(180)
def test_every_phase_is_timed_and_positive(report):
    for run in ("rllib", "direct"):
        records = report[run]["records"]
        assert len(records) == 2
        for record in records:
            assert set(PHASES) <= set(record)
            assert record["iteration"] > 0
    rllib = report["rllib"]["records"]
    for record in rllib:
        for phase in PHASES:  # the KL loss is on, so the reference forward runs too
            assert record[phase] > 0, phase
        assert set(OVERHEAD_PARTS) <= set(record)
    assert report["rllib"]["probes_missing"] == []


def test_phases_add_up_to_at_most_the_iteration(report):
    for run in ("rllib", "direct"):
        for record in report[run]["records"]:
            listed = sum(record[p] for p in PHASES if p != "driver_overhead")
            assert listed <= record["iteration"]
            total = sum(record[p] for p in PHASES)
            assert total == pytest.approx(record["iteration"], rel=1e-9)
    for record in report["rllib"]["records"]:
        parts = sum(record[p] for p in OVERHEAD_PARTS)
        assert parts == pytest.approx(record["driver_overhead"], abs=1e-6)


def test_responses_run_to_the_fixed_length_and_overhead_is_sane(report):
    for run in ("rllib", "direct"):
        assert report[run]["mean"]["mean_response_length"] == 8
        assert report[run]["mean"]["tokens_per_s/generation"] > 0
        assert report[run]["peak_rss_mb"] > 0
    assert report["framework_overhead"] > 0.5
    assert report["rllib"]["params"] == report["direct"]["params"] > 0


def test_results_keep_one_small_summary_per_workload_without_machine_paths():
    import json

    from benchmarks.harness import compact_report, load_reports

    results = REPO_ROOT / "benchmarks" / "results"
    for path in sorted(results.glob("*.json")):
        text = path.read_text()
        assert "/root/" not in text and "/tmp/" not in text and "/home/" not in text, path
        assert '"records"' not in text, path
        assert len(text) < 20_000, path
    reports = load_reports(str(results / "tiny.json"))
    assert len(reports) == 2 and reports[0]["framework_overhead"] > 0
    record = {k: v for k, v in reports[0]["direct"]["mean"].items()
              if not k.startswith(("tokens_per_s", "median"))}
    full = {"workload": {"model": "m", "model_dir": "/root/x", "profile_dir": None},
            "direct": {"records": [record], "peak_rss_mb": 5.0}}
    compact = compact_report(full)
    assert "model_dir" not in compact["workload"] and "records" not in compact["direct"]
    assert compact["direct"]["peak_rss_mb"] == 5.0
    assert json.loads(json.dumps(compact)) == compact


def test_weight_sync_benchmark_times_in_rotating_turns_and_tabulates_ratios():
    from benchmarks.weight_sync import _interleaved, format_table, ratios

    calls = []
    times = _interleaved({"a": lambda: calls.append("a") or 0.5,
                          "b": lambda: calls.append("b")}, reps=3)
    assert times["a"] == 0.5 and 0 <= times["b"] < 0.5  # a float return is the timing
    assert calls == ["a", "b", "b", "a", "a", "b", "b", "a"]  # warm-up round, then rotated
    measured = {"local_sync_s": 2.0, "copy_in_place_s": 1.0, "shm_sync_s": 1.5,
                "object_store_sync_s": 10.0, "memcpy_s": 0.5, "shm_bytes": 2**20}
    assert ratios(measured)["shm (auto) / memcpy"] == 3.0
    table = format_table({"m": {**measured, "dtype": "float32", "measured": measured}})
    assert "| **local / copy_ in place** | **2.00x** |" in table
    assert "| bytes per sync (one runner) | 1 MiB (float32) |" in table
