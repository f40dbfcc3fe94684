"""Safe checkpoints: written whole or not at all, checked before they are restored.

RLlib's `Checkpointable.save_to_path` writes component after component into the final
folder, so a save that fails half-way leaves a folder that looks like a checkpoint, and
`restore_from_path` silently skips a component whose folder is missing (a checkpoint
without ``learner_group/`` restores the iteration counter onto freshly initialised
weights).  Here:

* `atomic_save` has RLlib write into a hidden scratch folder next to the target, adds a
  manifest (`MANIFEST_FILE`: every file with its size and SHA-256, the components, the
  training iteration and the run that wrote it), then renames the folder into place;
* `verify_checkpoint` refuses a folder whose manifest is missing a component or whose
  files are missing, truncated or changed, naming the component and the file;
* `prune_checkpoints` keeps the newest K checkpoints one run wrote into one folder;
* `newest_complete_checkpoint` finds the newest checkpoint of a Tune trial folder that
  passes `verify_checkpoint` (optionally no newer than a given iteration);
* `write_resume_point` / `read_resume_point`: where a Tune trial continues from at its next
  start, as the driver decided it (`rllib_grpo.cli.resume.ContinueTrialResults`, from the
  checkpoints and the results recorded in the trial folder) and the trial reads it.

No Ray here; `rllib_grpo.rllib.algorithm.grpo.GRPO` calls these from its checkpoint hooks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

MANIFEST_FILE = "grpo_manifest.json"
RESUME_POINT_FILE = "grpo_resume_point.json"  # in a Tune trial folder
MANIFEST_VERSION = 1
TOP_LEVEL = "(top level)"
_CHUNK = 1 << 20


class CheckpointError(ValueError):
    """A checkpoint that must not be restored (incomplete or corrupt); the message names
    the checkpoint, the component and the file."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def component_of(relative: str) -> str:
    """The component a checkpoint file belongs to: its top folder, or `TOP_LEVEL`."""
    head, sep, _ = relative.partition("/")
    return head if sep else TOP_LEVEL


def build_manifest(folder: Path, *, components: Iterable[str], iteration: int,
                   run_id: str) -> dict[str, Any]:
    """The manifest of the checkpoint in ``folder`` (every file but the manifest itself)."""
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        relative = path.relative_to(folder).as_posix()
        if relative != MANIFEST_FILE:
            files[relative] = {"size": path.stat().st_size, "sha256": _sha256(path)}
    return {"version": MANIFEST_VERSION, "run_id": run_id, "training_iteration": int(iteration),
            "written_at": time.time(), "components": sorted(set(components)), "files": files}


def read_manifest(folder: str | os.PathLike) -> dict[str, Any] | None:
    """The manifest of a checkpoint folder, or None if it has none (or it is unreadable)."""
    try:
        return json.loads((Path(folder) / MANIFEST_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def verify_checkpoint(folder: str | os.PathLike, *, required_components: Iterable[str] = (),
                      checksums: bool = True) -> dict[str, Any] | None:
    """Raise `CheckpointError` unless ``folder`` holds a complete, unchanged checkpoint.

    With a manifest, every component it lists must be present and every file must have its
    recorded size and (with ``checksums``) its SHA-256.  ``required_components`` must be present either way (a
    checkpoint written before manifests existed is checked for these only).  Returns the
    manifest (None for a checkpoint without one).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"checkpoint {folder}: no such folder")
    manifest = read_manifest(folder)
    if manifest is None and (folder / MANIFEST_FILE).exists():
        raise CheckpointError(f"checkpoint {folder}: its manifest {MANIFEST_FILE} is "
                              "unreadable (the checkpoint was not completely written)")
    listed = set(manifest["components"]) if manifest else set()
    for component in sorted(set(required_components) | listed):
        if component != TOP_LEVEL and not (folder / component).is_dir():
            raise CheckpointError(
                f"checkpoint {folder}: component '{component}/' is missing; this checkpoint "
                "is incomplete and cannot be restored (use an earlier checkpoint)")
    if manifest is None:
        return None
    for relative, entry in manifest["files"].items():
        path, component = folder / relative, component_of(relative)
        name = f"'{component}/'" if component != TOP_LEVEL else component
        if not path.is_file():
            raise CheckpointError(f"checkpoint {folder}: component {name} is incomplete: "
                                  f"{relative} is missing (use an earlier checkpoint)")
        if path.stat().st_size != entry["size"] or (
                checksums and _sha256(path) != entry["sha256"]):
            raise CheckpointError(f"checkpoint {folder}: component {name} is corrupt: "
                                  f"{relative} does not match its checksum (use an earlier "
                                  "checkpoint)")
    return manifest


def atomic_save(target: str | os.PathLike, write: Callable[[str], Any], *,
                components: Callable[[], Iterable[str]], iteration: int, run_id: str) -> str:
    """Run ``write(scratch)`` into a scratch folder beside ``target``, add the manifest,
    then move it to ``target``: a failed save leaves ``target`` as it was.

    An existing ``target`` (Tune hands over an empty temporary folder) is replaced.
    """
    target = Path(target).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    scratch = target.parent / f".{target.name}.writing-{token}"
    try:
        write(str(scratch))
        manifest = build_manifest(scratch, components=components(), iteration=iteration,
                                  run_id=run_id)
        _write_json_durably(scratch / MANIFEST_FILE, manifest)
        _replace_folder(scratch, target, token)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return str(target)


def _write_json_durably(path: Path, data: dict[str, Any]) -> None:
    with path.open("w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _replace_folder(new: Path, target: Path, token: str) -> None:
    if target.is_dir() and not any(target.iterdir()):
        target.rmdir()
    if target.exists():
        old = target.parent / f".{target.name}.replaced-{token}"
        os.rename(target, old)
        os.rename(new, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, target)


def prune_checkpoints(parent: str | os.PathLike, run_id: str, keep_last: int) -> list[str]:
    """Delete all but the newest ``keep_last`` checkpoints that run ``run_id`` wrote into
    ``parent`` (others' folders are never touched).  Returns the deleted paths."""
    if keep_last <= 0:
        return []
    ours = []
    for folder in Path(parent).iterdir():
        manifest = read_manifest(folder) if folder.is_dir() else None
        if manifest and manifest.get("run_id") == run_id:
            ours.append((manifest["training_iteration"], manifest["written_at"], folder))
    ours.sort()
    deleted = [folder for *_, folder in ours[:-keep_last]]
    for folder in deleted:
        shutil.rmtree(folder, ignore_errors=True)
    return [str(folder) for folder in deleted]


def newest_complete_checkpoint(trial_dir: str | os.PathLike, pattern: str = "checkpoint_*", *,
                               up_to: int | None = None) -> tuple[Path, int] | None:
    """``(folder, training_iteration)`` of the newest checkpoint in ``trial_dir`` that passes
    `verify_checkpoint` (and, with ``up_to``, was written at iteration ``up_to`` or before),
    or None.  Incomplete and corrupt ones are skipped with a warning."""
    found = []
    for folder in Path(trial_dir).glob(pattern):
        if not folder.is_dir():
            continue
        manifest = read_manifest(folder)
        if up_to is not None and manifest is not None and manifest.get(
                "training_iteration", 0) > up_to:
            continue
        try:
            manifest = verify_checkpoint(folder)
        except CheckpointError as err:
            logger.warning("skipping %s", err)
            continue
        if manifest is not None:
            found.append((manifest["training_iteration"], manifest["written_at"], folder))
    if not found:
        return None
    iteration, _, folder = max(found)
    return folder, iteration


def write_resume_point(trial_dir: str | os.PathLike, checkpoint: tuple[Path, int] | None) -> None:
    """Record that the Tune trial of ``trial_dir`` continues from ``checkpoint``
    (``(folder, training_iteration)``; None: from the start) at its next start."""
    folder = Path(trial_dir)
    folder.mkdir(parents=True, exist_ok=True)
    point = {"checkpoint": checkpoint[0].name if checkpoint else None,
             "training_iteration": checkpoint[1] if checkpoint else 0}
    scratch = folder / f".{RESUME_POINT_FILE}.{uuid.uuid4().hex[:8]}"
    _write_json_durably(scratch, point)
    os.replace(scratch, folder / RESUME_POINT_FILE)


def clear_resume_point(trial_dir: str | os.PathLike) -> None:
    """Forget the resume point of ``trial_dir`` (the trial then restores what Tune names)."""
    (Path(trial_dir) / RESUME_POINT_FILE).unlink(missing_ok=True)


def read_resume_point(trial_dir: str | os.PathLike) -> tuple[Path | None, int] | None:
    """``(checkpoint folder or None for the start, training_iteration)`` recorded by
    `write_resume_point` for ``trial_dir``, or None when none is recorded."""
    try:
        point = json.loads((Path(trial_dir) / RESUME_POINT_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    name = point["checkpoint"]
    return (Path(trial_dir) / name if name else None), int(point["training_iteration"])
