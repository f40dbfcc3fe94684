"""Check the package's layering: no import cycle, and no import from a lower layer to a higher one.

Every import statement counts, at module level or inside a function, since a lazy import is
still a dependency.  Layers, lowest first (a module may import its own layer or lower ones):

    1   algos                    math: pure torch functions and registries
    2   data, rewards, envs      text environments, datasets, rollouts, rewards, built-in tasks
    3.0 weights                  the weight protocol without Ray: names, layout, transports, plan
    3.1 models                   built-in models, loading, LoRA, export
    3.2 samplers                 vLLM and transformers samplers (weight receivers)
    4.0 rllib, rllib.config      RLlib glue where a config is built: settings, GRPOConfig, checks
    4.1 rllib.learner            what runs in a learner actor
    4.1 rllib.env_runner         what runs in an env-runner actor (never imports the learner's)
    4.2 rllib.algorithm          the driver
    5   cli                      entry points: rllib train, rllib-grpo explain, eval, export
    6   demo                     the demo programs (``python -m rllib_grpo.demo``)

The learner's and the env runner's rooms share a layer but may not import each other: they
run in different processes.  ``rllib_grpo/logs.py`` imports nothing of the package (layer
0); the package root is an entry point (layer 6).

    python tools/check_layers.py      # prints each problem; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "rllib_grpo"
LAYERS = {"logs": 0, "algos": 1, "data": 2, "rewards": 2, "envs": 2,
          "weights": 3.0, "models": 3.1, "samplers": 3.2, "rllib": 4.0, "rllib.config": 4.0,
          "rllib.learner": 4.1, "rllib.env_runner": 4.1, "rllib.algorithm": 4.2, "cli": 5,
          "demo": 6, "": 6}
# Rooms of one layer that run in different processes and so never import each other.
APART = [("rllib.learner", "rllib.env_runner")]
# Source folders of the package's modules (``rllib_grpo.envs`` ships from ``envs/``).
SOURCES = {PACKAGE: ROOT / PACKAGE, f"{PACKAGE}.envs": ROOT / "envs"}


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name."""
    found = {}
    for prefix, folder in SOURCES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([prefix, *parts])] = path
    return found


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports (the longest known prefix of each import)."""
    is_package = path.name == "__init__.py"
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name and candidate != PACKAGE:
                targets.add(candidate)
                break
    return targets


def room(name: str) -> str:
    """The longest key of `LAYERS` that holds the module ``name``."""
    parts = name.split(".")[1:]
    for size in range(len(parts), -1, -1):
        key = ".".join(parts[:size])
        if key in LAYERS:
            return key
    return ""


def layer(name: str) -> float:
    return LAYERS[room(name)]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def problems() -> list[str]:
    """Every upward import and every cycle, as lines."""
    mods = modules()
    graph = {name: imports_of(name, path, set(mods)) for name, path in mods.items()}
    found = [f"upward import: {src} (layer {layer(src)}) imports {dst} (layer {layer(dst)})"
             for src, dsts in sorted(graph.items()) for dst in sorted(dsts)
             if layer(dst) > layer(src)]
    found += [f"import across processes: {src} ({room(src)}) imports {dst} ({room(dst)})"
              for src, dsts in sorted(graph.items()) for dst in sorted(dsts)
              if (room(src), room(dst)) in APART or (room(dst), room(src)) in APART]
    found += ["import cycle: " + " <-> ".join(c) for c in cycles(graph)]
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    print(f"layers: {len(modules())} modules, {len(found)} problem(s)")
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
