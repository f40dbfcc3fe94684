"""The ``key=value`` overrides a verl launch script hands to verl, read by running it.

The script runs under bash with fake ``python3``, ``ray`` and ``uv`` commands first on
``PATH``: each records its arguments, and the overrides are what follows ``-m <module>``
(``python3 -m verl.trainer.main_ppo ...``, ``ray job submit ... -- python3 -m
recipe.dapo.main_dapo ...``).  ``python3 -c ...`` (verl's probe for ``torch_npu``) fails,
so the scripts take their GPU branch.  No network, no verl needed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "verl"
FAKE_HOME = "/home/verl-user"
_RECORDER = """#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi
for arg in "$@"; do printf '%s\\0' "$arg"; done >> "$VERL_ARGS_OUT"
"""


def script_overrides(name: str, tmp_path: Path, env: dict[str, str] | None = None,
                     ) -> tuple[str, list[str]]:
    """``(module, overrides)`` that ``tests/fixtures/verl/<name>`` launches verl with."""
    fake_bin = tmp_path / "fake_bin"
    fake_bin.mkdir(exist_ok=True)
    for command in ("python3", "ray", "uv"):
        path = fake_bin / command
        path.write_text(_RECORDER)
        path.chmod(0o755)
    out = tmp_path / f"{name}.args"
    out.write_bytes(b"")
    run_env = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "HOME": FAKE_HOME,
               "VERL_ARGS_OUT": str(out), "DEVICE": "gpu", "VERL_USE_UV": "0",
               **(env or {})}
    subprocess.run(["bash", str(FIXTURES / name)], env=run_env, cwd=tmp_path, check=True,
                   capture_output=True, timeout=60)
    args = out.read_bytes().decode().split("\0")[:-1]
    start = args.index("-m")
    return args[start + 1], args[start + 2:]
