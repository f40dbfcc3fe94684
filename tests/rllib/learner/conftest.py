"""The learner shared by the update comparisons of this folder (test_packing.py,
test_shared_prompts_update.py)."""

from __future__ import annotations

import pytest

from tests.helpers import local_learner


@pytest.fixture(scope="module")
def learner():
    """One tiny float64 learner and its start weights (`local_learner.float64_learner`)."""
    return local_learner.float64_learner()
