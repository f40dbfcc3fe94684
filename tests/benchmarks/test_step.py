"""The step suite on the tiny model, run through the harness: every phase reported, each
probed phase inside the span that contains it, the results file and the README written.

Sanity checks only, no speed thresholds: CI machines are shared and noisy.
"""

from __future__ import annotations

import json

import pytest

from benchmarks.common import OVERHEAD_PARTS, PHASES

pytestmark = pytest.mark.ray  # the suite runs the algorithm on a Ray of its own

TINY = ["--model", "builtin:tiny", "--prompts", "4", "--group-size", "4",
        "--response-length", "8", "--iterations", "2", "--warmup", "1", "--sampler", "hf",
        "--old-log-prob-pass"]


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory) -> dict:
    """`python -m benchmarks step` on the tiny workload into a scratch results folder, with
    the runs' per-iteration records kept by a spy on `run_rounds` (it calls through)."""
    import benchmarks.step as step
    from benchmarks.harness import run_suite

    folder = tmp_path_factory.mktemp("bench")
    captured: dict = {}
    real = step.run_rounds

    def spy(*args, **kwargs):
        captured.update(real(*args, **kwargs))
        return captured

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(step, "run_rounds", spy)
        results = run_suite("step", TINY, results_dir=folder, readme=folder / "README.md")
    return {"results": results, "runs": captured, "folder": folder}


@pytest.mark.timeout(300)
def test_every_phase_is_timed_and_positive(suite_run):
    runs = suite_run["runs"]
    for run in ("rllib", "direct"):
        records = runs[run]["records"]
        assert len(records) == 2
        for record in records:
            assert set(PHASES) <= set(record)
            assert record["iteration"] > 0
    for record in runs["rllib"]["records"]:
        for phase in PHASES:  # the KL loss is on, so the reference forward runs too
            assert record[phase] > 0, phase
        assert set(OVERHEAD_PARTS) <= set(record)
    assert runs["rllib"]["probes_missing"] == []


def test_each_probed_phase_fits_inside_the_span_that_contains_it(suite_run):
    """The probes time nested spans independently (generate and score inside sampling,
    the learner's passes inside its update call, the step inside train()), so each part of
    the driver overhead (outer span less the spans inside it) is non-negative up to float
    rounding; a phase counted twice, or time put in the wrong span, makes one negative."""
    runs = suite_run["runs"]
    for run in ("rllib", "direct"):
        for record in runs[run]["records"]:
            listed = sum(record[p] for p in PHASES if p != "driver_overhead")
            assert 0 < listed <= record["iteration"], run
    for record in runs["rllib"]["records"]:
        for part in OVERHEAD_PARTS:
            assert record[part] >= -1e-9, (part, record[part])


def test_responses_run_to_the_fixed_length_and_overhead_is_sane(suite_run):
    from benchmarks.step import summarise

    runs = suite_run["runs"]
    for run in ("rllib", "direct"):
        mean = summarise(runs[run])
        assert mean["mean_response_length"] == 8
        assert mean["tokens_per_s/generation"] > 0
        assert runs[run]["peak_rss_mb"] > 0
    assert runs["rllib"]["params"] == runs["direct"]["params"] > 0


def test_the_suite_writes_its_results_file_and_the_readme(suite_run):
    folder, results = suite_run["folder"], suite_run["results"]
    written = json.loads((folder / "step.json").read_text())
    assert written["commands"] == ["python -m benchmarks step " + " ".join(TINY)]
    assert written["machine"]["cores"] >= 1 and written["machine"]["cpu"]
    (row,) = written["rows"]
    assert row["model"] == "builtin:tiny" and row["batch"] == "4x4x8"
    assert row["overhead"] == pytest.approx(
        row["RLlib iteration s"] / row["plain-loop iteration s"], rel=1e-3)  # 4 digits kept
    assert 0 < row["driver overhead share"] < 1
    readme = (folder / "README.md").read_text()
    assert "## step: " in readme and written["commands"][0] in readme
    assert "| model | params (M) | batch |" in readme
    assert results["rows"][0]["model"] == "builtin:tiny"
