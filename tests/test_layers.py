"""The package's folders are its layers: no import cycle, no upward import, and the public
entry points resolve in any import order."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_tune_resolves_grpo_when_rllib_grpo_is_imported_first():
    out = _run("""
        import sys
        import rllib_grpo
        assert "ray" not in sys.modules and "transformers" not in sys.modules
        from ray import tune
        from ray.tune.registry import get_trainable_cls
        print(get_trainable_cls("GRPO").__name__)
    """)
    assert out.strip().endswith("GRPO")


def test_tune_resolves_grpo_when_ray_is_imported_first():
    out = _run("""
        from ray.tune.registry import get_trainable_cls
        import ray.rllib
        import rllib_grpo
        print(get_trainable_cls("GRPO").__name__)
    """)
    assert out.strip().endswith("GRPO")
