"""Docstrings point at things that exist: every `rllib_grpo.dotted.name` in backticks imports
and resolves, and every repository path they name (docs/..., benchmarks/..., tests/...) is in
the repository."""

from __future__ import annotations

import importlib
import re

from tests.conftest import REPO_ROOT

SOURCES = sorted([*(REPO_ROOT / "rllib_grpo").rglob("*.py"), *(REPO_ROOT / "envs").rglob("*.py")])
DOTTED = re.compile(r"`(rllib_grpo(?:\.\w+)+)`")
PATH = re.compile(r"\b((?:docs|benchmarks|configs|examples|tools|tests)/[\w/.-]+\.(?:md|py|yaml|sh))")
# Paths in other projects' repositories that our docstrings cite.
EXTERNAL = ("examples/offline_inference/",)  # vLLM's RLHF examples


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for size in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:size]))
        except ImportError:
            continue
        try:
            for attribute in parts[size:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return False
        return True
    return False


def test_dotted_names_in_docstrings_resolve():
    dangling = [f"{path.relative_to(REPO_ROOT)}: {name}" for path in SOURCES
                for name in sorted(set(DOTTED.findall(path.read_text())))
                if not _resolves(name)]
    assert not dangling, "\n".join(dangling)


def test_repository_paths_in_docstrings_exist():
    missing = [f"{path.relative_to(REPO_ROOT)}: {ref}" for path in SOURCES
               for ref in sorted(set(PATH.findall(path.read_text())))
               if not ref.startswith(EXTERNAL) and not (REPO_ROOT / ref).exists()]
    assert not missing, "\n".join(missing)


# What tests/gpu/ scripts import from this repository (the package, the benchmarks, the
# tests' helpers).
OURS = ("rllib_grpo", "benchmarks", "tests")


def test_the_gpu_scripts_import_what_the_package_has():
    """tests/gpu/ runs only on a GPU machine: its imports must follow the layout here."""
    import ast

    broken = []
    scripts = sorted((REPO_ROOT / "tests" / "gpu").glob("*.py"))
    assert {"gpu_review_check.py", "gpu_vllm_check.py"} <= {s.name for s in scripts}
    for script in scripts:
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(OURS):
                broken += [f"{script.name}: from {node.module} import {alias.name}"
                           for alias in node.names
                           if not _resolves(f"{node.module}.{alias.name}")]
            elif isinstance(node, ast.Import):
                broken += [f"{script.name}: import {alias.name}" for alias in node.names
                           if alias.name.startswith(OURS) and not _resolves(alias.name)]
    assert not broken, "\n".join(broken)


def test_pytest_does_not_collect_the_gpu_scripts():
    """tests/gpu/ holds scripts run by hand on a GPU machine, never tests that skip to green:
    pytest collects nothing there, even when it is named."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                           "-p", "no:cacheprovider", "tests/gpu"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "no tests collected" in proc.stdout, proc.stdout + proc.stderr
