"""``rllib_grpo.algos`` must stay free of Ray and transformers (the lowest layer)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO_ROOT


def test_algos_import_pulls_in_no_ray_or_transformers():
    code = textwrap.dedent(
        """
        import sys
        import rllib_grpo.algos
        heavy = sorted(
            m for m in sys.modules if m.startswith("ray") or m.startswith("transformers")
        )
        assert not heavy, heavy
        print("ok")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO_ROOT
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip().endswith("ok")
