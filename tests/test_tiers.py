"""The two test tiers (tests/helpers/tiers.py): under ``-m 'not ray'`` a test that uses a Ray
fixture is left out, and one that starts Ray itself, or in a subprocess, fails instead of
starting it; the full tier selects the tests that use a Ray fixture."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT

PROBE = '''
import pytest


@pytest.fixture
def ray_session():
    raise AssertionError("the ray_session fixture ran")


def test_uses_the_ray_fixture(ray_session):
    pass


def test_starts_ray_itself():
    import ray

    ray.init(address="local", num_cpus=1, include_dashboard=False)
    ray.shutdown()


def test_starts_ray_in_a_subprocess():
    import subprocess
    import sys

    code = "import ray; ray.init(address='local', num_cpus=1, include_dashboard=False)"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_needs_no_ray():
    assert 1 + 1 == 2
'''


def _run_probe(tmp_path, marker_expression: str, *selection: str) -> str:
    """pytest on the probe file with the tiers' hooks as a plugin, outside the repository's
    configuration (no addopts, no conftest)."""
    (tmp_path / "test_probe.py").write_text(textwrap.dedent(PROBE))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.helpers.tiers", "-p", "no:cacheprovider",
         "-q", "-rf", "--rootdir", str(tmp_path), "-m", marker_expression,
         *([f"{tmp_path / 'test_probe.py'}::{name}" for name in selection]
           or [str(tmp_path / "test_probe.py")])],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    return result.stdout + result.stderr


def test_the_fast_tier_leaves_ray_fixtures_out_and_refuses_to_start_ray(tmp_path):
    out = _run_probe(tmp_path, "not ray and not slow")
    assert "2 failed, 1 passed, 1 deselected" in out, out
    assert "FAILED" in out and "test_starts_ray_itself" in out
    assert "RayStartedInFastTier" in out and "the fast tier (-m 'not ray')" in out
    assert "test_starts_ray_in_a_subprocess" in out and "the-fast-tier-starts-no-ray" in out
    assert "the ray_session fixture ran" not in out


def test_the_full_tier_selects_the_tests_that_use_ray_fixtures(tmp_path):
    # Only the fixture's test and the Ray-free one: the full tier would really start Ray.
    out = _run_probe(tmp_path, "not slow", "test_uses_the_ray_fixture", "test_needs_no_ray")
    assert "1 passed" in out and "1 error" in out, out
    assert "the ray_session fixture ran" in out
    assert "RayStartedInFastTier" not in out
