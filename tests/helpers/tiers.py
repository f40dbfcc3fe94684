"""The two test tiers: the ``ray`` marker and the fast tier's guard against starting Ray.

``make test-fast`` runs ``pytest -m 'not ray and not slow and not vllm_vision'``: the tests
that need no Ray cluster.  A test is in the ``ray`` tier when it uses a Ray fixture (marked
here at collection) or when its module says so (``pytestmark = pytest.mark.ray``: modules that
build an algorithm, start Ray or run a training in a subprocess).  When the marker expression
leaves the ``ray`` tier out, a test that starts Ray without the marker fails instead of
slowing the fast tier down: ``ray.init`` raises in this process, and Ray's temporary folder
(``RAY_TMPDIR``, inherited by subprocesses) is a path no process can create.
tests/conftest.py loads these hooks; tests/test_tiers.py checks them.
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import pytest

# Fixtures that hold a Ray session: a test that uses one (directly or through another
# fixture) is in the ``ray`` tier.
RAY_FIXTURES = frozenset({"ray_session", "own_ray_session"})
RAY_MARKER_HELP = ("ray: starts Ray (a Ray fixture, an algorithm, a training in a subprocess); "
                   "`make test-fast` leaves these out")
# Ray's temporary folder in the fast tier: under /dev/null, so that a Ray started in a
# subprocess fails at once, naming it.
NO_RAY_TMPDIR = "/dev/null/the-fast-tier-starts-no-ray"
# In a marker expression: the ``ray`` tier is deselected.
_WITHOUT_RAY = re.compile(r"\bnot\s+ray\b")


class RayStartedInFastTier(RuntimeError):
    """A test of the fast tier (``-m 'not ray ...'``) tried to start Ray."""


def fast_tier(config: pytest.Config) -> bool:
    """Whether this run leaves the ``ray`` tier out (``make test-fast``)."""
    return bool(_WITHOUT_RAY.search(config.getoption("markexpr") or ""))


def _refuse_ray_init(*args: Any, **kwargs: Any) -> None:
    raise RayStartedInFastTier(
        "this test starts Ray, but the fast tier (-m 'not ray') runs without it: use the "
        "`ray_session` fixture, or mark the module `pytestmark = pytest.mark.ray`")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", RAY_MARKER_HELP)
    if not fast_tier(config):
        return
    os.environ["RAY_TMPDIR"] = NO_RAY_TMPDIR
    import ray
    import ray._private.worker

    # Ray's auto-init (a remote call, ``ray.get``) goes through ``ray.init`` too.
    guard = functools.wraps(ray.init)(_refuse_ray_init)
    ray.init = guard
    ray._private.worker.init = guard


@pytest.hookimpl(tryfirst=True)  # before pytest's own ``-m`` selection sees the items
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if RAY_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.ray)
