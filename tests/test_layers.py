"""The package's folders are its layers: no import cycle, no upward import, and the public
entry points resolve in any import order."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tools"))

import check_layers  # noqa: E402


def test_no_import_cycle_and_no_upward_import():
    assert check_layers.problems() == []


def test_checker_finds_a_cycle_and_an_upward_import():
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert check_layers.cycles(graph) == [["a", "b"]]
    assert check_layers.layer("rllib_grpo.algos.kl") < check_layers.layer("rllib_grpo.rllib.config.grpo_config")
    assert check_layers.layer("rllib_grpo.cli.main") > check_layers.layer("rllib_grpo.rllib.config.grpo_config")


def _run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=180, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout


def test_importing_the_package_starts_neither_ray_nor_transformers():
    out = _run("""
        import sys
        import rllib_grpo
        print(sorted(m for m in ("ray", "transformers") if m in sys.modules))
    """)
    assert out.strip() == "[]"


@pytest.mark.processes
def test_tune_resolves_grpo_once_the_algorithm_is_imported():
    out = _run("""
        from ray.tune.registry import get_trainable_cls
        from rllib_grpo import GRPO
        print(get_trainable_cls("GRPO") is GRPO)
    """)
    assert out.strip().endswith("True")


@pytest.mark.processes
def test_register_makes_grpo_known_to_tune():
    out = _run("""
        from ray.tune.registry import get_trainable_cls
        import rllib_grpo

        def known():
            try:
                return get_trainable_cls("GRPO").__name__ == "GRPO"
            except Exception:  # TuneError: unknown trainable
                return False

        before = known()
        rllib_grpo.register()
        print(before, known())
    """)
    assert out.strip().endswith("False True")
