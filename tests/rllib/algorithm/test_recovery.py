"""Crash recovery and Tune schedulers: a dead learner is named; a trial Tune retries
(``rllib train --max-failures``) continues from its newest complete checkpoint with each
iteration recorded once in result.json and progress.csv; Population Based Training's
exploit restores the donor's checkpoint, iteration included."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from tests.conftest import tiny_config

STOP = 6


def _iterations(trial_dir: Path) -> list[int]:
    return [json.loads(line)["training_iteration"]
            for line in (trial_dir / "result.json").read_text().splitlines()]


def _progress_iterations(trial_dir: Path) -> list[int]:
    return [int(row["training_iteration"]) for row in csv.DictReader(io.StringIO(
        (trial_dir / "progress.csv").read_text(), newline=""))]


@pytest.mark.slow
def test_a_dead_learner_is_named(ray_session):
    import ray

    from rllib_grpo.rllib.algorithm.resilience import LearnerDiedError

    algo = tiny_config().learners(num_learners=1).build_algo()
    try:
        algo.train()
        (actor,) = algo.learner_group._worker_manager.actors().values()
        ray.kill(actor, no_restart=True)
        with pytest.raises(LearnerDiedError, match=r"learner 0 of 1 \(Ray actor \w+\) died "
                           r"during training step 2: .*--max-failures") as err:
            algo.train()
        assert isinstance(err.value.__cause__, ray.exceptions.ActorDiedError)
    finally:
        algo.stop()


def _kill_learner_once(algo_cls: type) -> type:
    """``algo_cls`` whose learner actor is killed after iteration 5, once per trial folder."""

    class KillsItsLearner(algo_cls):  # type: ignore[misc, valid-type]
        def training_step(self) -> None:
            import ray

            marker = Path(self._storage.trial_fs_path) / "learner_killed"
            if self.iteration == 5 and not marker.exists():
                marker.touch()
                (actor,) = self.learner_group._worker_manager.actors().values()
                ray.kill(actor, no_restart=True)
            super().training_step()

    return KillsItsLearner


@pytest.mark.slow
def test_a_lost_learner_restarts_the_trial_recording_each_iteration_once(ray_session,
                                                                          tmp_path):
    from ray import tune

    from rllib_grpo.cli.resume import ContinueTrialResults
    from rllib_grpo.rllib.algorithm import GRPO

    # Checkpoints at 2 and 4; the learner dies in iteration 6, after 5 was recorded: the
    # trial continues from 4, and 5 is recorded again, replacing the first one.
    grid = tune.Tuner(
        _kill_learner_once(GRPO), param_space=tiny_config().learners(num_learners=1),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="retry", stop={"training_iteration": STOP},
            callbacks=[ContinueTrialResults()], verbose=0,
            failure_config=tune.FailureConfig(max_failures=1),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2)),
    ).fit()
    (result,) = grid
    assert result.error is None, result.error
    trial = Path(result.path)
    assert (trial / "learner_killed").exists()
    assert _iterations(trial) == _progress_iterations(trial) == list(range(1, STOP + 1))
    assert result.metrics["training_iteration"] == STOP


@pytest.mark.slow
def test_pbt_exploit_restores_the_donors_iteration(ray_session, tmp_path):
    from ray import tune
    from ray.tune.schedulers import PopulationBasedTraining

    from rllib_grpo.rllib.algorithm import GRPO

    pbt = PopulationBasedTraining(
        time_attr="training_iteration", metric="actor/loss", mode="min",
        perturbation_interval=2, hyperparam_mutations={"lr": [1e-3, 1e-2]})
    grid = tune.Tuner(
        GRPO, param_space=tiny_config(lr=tune.grid_search([1e-3, 1e-2])),
        tune_config=tune.TuneConfig(scheduler=pbt),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="pbt", stop={"training_iteration": STOP},
            verbose=0, checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1)),
    ).fit()
    assert not grid.errors, grid.errors
    # Trial index (the start of PBT's tags) -> folder.
    folders = {int(r.metrics["trial_id"].split("_")[1]): Path(r.path) for r in grid}
    # Each exploit: [target tag, donor tag, target iteration, donor's iteration now, ...].
    exploits = [json.loads(line) for line in
                (tmp_path / "pbt" / "pbt_global.txt").read_text().splitlines()]
    assert exploits, "no exploit happened"
    donor_iterations: dict[int, list[int]] = {}
    for target, _donor, _target_iteration, donor_iteration, *_ in exploits:
        donor_iterations.setdefault(int(target.split("_")[0]), []).append(donor_iteration)
    for index, folder in folders.items():
        rows = _iterations(folder)
        # An exploit continues from the checkpoint the donor saved at one of its
        # perturbations (at most its iteration when PBT chose it), not from a newer one.
        restored = [after - 1 for before, after in zip(rows[:-1], rows[1:], strict=True)
                    if after != before + 1]
        assert all(1 <= k <= max(donor_iterations.get(index, [0])) for k in restored), (
            rows, exploits)
        assert rows[-1] == STOP and max(rows) == STOP, rows
