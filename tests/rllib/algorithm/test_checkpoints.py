"""Safe checkpoints: atomic writes, a manifest with checksums, refusal of incomplete ones."""

from __future__ import annotations

import json
import shutil
import types
from pathlib import Path

import pytest

from rllib_grpo.rllib.algorithm.checkpoints import (
    MANIFEST_FILE,
    CheckpointError,
    atomic_save,
    newest_complete_checkpoint,
    prune_checkpoints,
    verify_checkpoint,
    write_resume_point,
)
from tests.conftest import tiny_config


def _write_fake(folder: str, payload: bytes = b"weights") -> None:
    root = Path(folder)
    (root / "learner_group" / "learner").mkdir(parents=True)
    (root / "learner_group" / "learner" / "state.pkl").write_bytes(payload)
    (root / "env_runner").mkdir()
    (root / "env_runner" / "state.pkl").write_bytes(b"position")
    (root / "algorithm_state.pkl").write_bytes(b"iteration")


def _save(target: Path, iteration: int = 1, run_id: str = "run", payload: bytes = b"w") -> str:
    return atomic_save(target, lambda d: _write_fake(d, payload),
                       components=lambda: ["learner_group", "env_runner"],
                       iteration=iteration, run_id=run_id)


def test_a_failed_save_leaves_nothing_that_looks_like_a_checkpoint(tmp_path):
    def half_written(folder: str) -> None:
        _write_fake(folder)
        raise TypeError("Got unsupported ScalarType BFloat16")

    with pytest.raises(TypeError):
        atomic_save(tmp_path / "ckpt", half_written, components=lambda: ["learner_group"],
                    iteration=3, run_id="r")
    assert list(tmp_path.iterdir()) == []


def test_the_manifest_lists_components_and_checksums_and_replaces_an_empty_target(tmp_path):
    target = tmp_path / "ckpt"
    target.mkdir()  # Tune hands save_checkpoint an empty temporary folder
    _save(target, iteration=7)
    manifest = json.loads((target / MANIFEST_FILE).read_text())
    assert manifest["training_iteration"] == 7
    assert manifest["components"] == ["env_runner", "learner_group"]
    assert set(manifest["files"]) == {"learner_group/learner/state.pkl",
                                      "env_runner/state.pkl", "algorithm_state.pkl"}
    assert verify_checkpoint(target)["run_id"] == "run"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no scratch folders left


@pytest.mark.parametrize("damage, needle", [
    (lambda c: shutil.rmtree(c / "learner_group"), "component 'learner_group/' is missing"),
    (lambda c: shutil.rmtree(c / "env_runner"), "component 'env_runner/' is missing"),
    (lambda c: (c / "learner_group/learner/state.pkl").unlink(),
     "'learner_group/' is incomplete: learner_group/learner/state.pkl is missing"),
    (lambda c: (c / "learner_group/learner/state.pkl").write_bytes(b"W"),
     "'learner_group/' is corrupt: learner_group/learner/state.pkl"),
    (lambda c: (c / MANIFEST_FILE).write_text("{trunc"), "manifest"),
])
def test_a_damaged_checkpoint_is_refused_naming_the_component(tmp_path, damage, needle):
    target = Path(_save(tmp_path / "ckpt"))
    damage(target)
    with pytest.raises(CheckpointError, match="use an earlier|unreadable") as err:
        verify_checkpoint(target)
    assert needle in str(err.value)


def test_a_checkpoint_without_manifest_must_still_have_its_learner_group(tmp_path):
    _write_fake(str(tmp_path / "old"))
    shutil.rmtree(tmp_path / "old" / "learner_group")
    with pytest.raises(CheckpointError, match="'learner_group/' is missing"):
        verify_checkpoint(tmp_path / "old", required_components=["learner_group"])


def test_keep_last_k_prunes_only_this_runs_checkpoints(tmp_path):
    for i in range(4):
        _save(tmp_path / f"mine_{i}", iteration=i, run_id="mine")
    _save(tmp_path / "other", iteration=0, run_id="other")
    (tmp_path / "unrelated").mkdir()
    deleted = prune_checkpoints(tmp_path, "mine", keep_last=2)
    assert sorted(Path(p).name for p in deleted) == ["mine_0", "mine_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine_2", "mine_3", "other",
                                                          "unrelated"]


def test_newest_complete_checkpoint_skips_a_corrupt_newer_one(tmp_path):
    for i in (1, 2, 3):
        _save(tmp_path / f"checkpoint_00000{i}", iteration=i)
    (tmp_path / "checkpoint_000003" / "env_runner" / "state.pkl").write_bytes(b"cut")
    folder, iteration = newest_complete_checkpoint(tmp_path)
    assert (folder.name, iteration) == ("checkpoint_000002", 2)


def test_grpo_refuses_to_restore_a_checkpoint_with_a_missing_component(ray_session, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    from rllib_grpo.rllib.algorithm.grpo import GRPO

    algo = tiny_config(keep_checkpoints=2).build_algo()
    try:
        algo.train()
        paths = [Path(algo.save_to_path(str(tmp_path / f"ckpt{i}"))) for i in range(3)]
        # keep_checkpoints=2: the oldest of this run's three is gone.
        assert [p.is_dir() for p in paths] == [False, True, True]
        good = paths[-1]
        manifest = verify_checkpoint(good)
        assert {"learner_group", "env_runner"} <= set(manifest["components"])
        assert manifest["training_iteration"] == 1

        for component in ("learner_group", "env_runner"):
            broken = tmp_path / f"without_{component}"
            shutil.copytree(good, broken)
            shutil.rmtree(broken / component)
            with pytest.raises(CheckpointError, match=f"'{component}/' is missing"):
                algo.restore_from_path(str(broken))
        with pytest.raises(CheckpointError, match="'learner_group/' is missing"):
            GRPO.from_checkpoint(str(tmp_path / "without_learner_group"))

        corrupt = tmp_path / "corrupt"
        shutil.copytree(good, corrupt)
        pickle = next((corrupt / "learner_group").rglob("module_state.pkl"))
        pickle.write_bytes(pickle.read_bytes()[:-1] + b"\0")
        with pytest.raises(CheckpointError, match="'learner_group/' is corrupt"):
            algo.restore_from_path(str(corrupt))
        truncated = tmp_path / "truncated"
        shutil.copytree(good, truncated)
        state = truncated / "learner_group" / "state.pkl"
        state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
        with pytest.raises(CheckpointError, match="'learner_group/' is corrupt"):
            Algorithm.from_checkpoint(str(truncated))  # RLlib's entry point, too

        algo.restore_from_path(str(good))  # the intact one restores
        assert algo.training_iteration == 1

        # Trainable.restore (and PBT's exploit) restores the checkpoint named ...
        trial = tmp_path / "trial"
        algo.save_to_path(str(trial / "checkpoint_000000"))
        algo.train()
        algo.save_to_path(str(trial / "checkpoint_000001"))
        algo.train()
        assert algo.training_iteration == 3
        algo.restore(str(trial / "checkpoint_000000"))
        assert algo.training_iteration == 1
        # ... and so does a Tune trial resuming from its own folder, unless the driver
        # recorded a resume point there (`ContinueTrialResults`: the newest checkpoint whose
        # results are recorded), whichever checkpoint its (lagging) snapshot names.
        algo._storage = types.SimpleNamespace(trial_fs_path=str(trial))
        algo.load_checkpoint(str(trial / "checkpoint_000001"))
        assert algo.training_iteration == 2
        write_resume_point(trial, (trial / "checkpoint_000000", 1))
        algo.load_checkpoint(str(trial / "checkpoint_000001"))
        assert algo.training_iteration == 1
        write_resume_point(trial, (trial / "checkpoint_000001", 2))
        algo.load_checkpoint(str(trial / "checkpoint_000000"))
        algo._storage = None
        assert algo.training_iteration == 2
    finally:
        algo.stop()
