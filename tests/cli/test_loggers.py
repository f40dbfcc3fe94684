"""verl's ``trainer.logger`` / the ``loggers`` setting map onto Tune's logger callbacks; a
logger whose package is missing is refused before Ray starts, naming the pip command."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.tune import logger_callbacks, mlflow_metric_name
from tests.conftest import tiny_config
from tests.helpers.cli_runs import ENV, RAY_LIMITS, TINY_VERL


def _errors(config) -> list[str]:
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(config)


def test_trainer_logger_sets_the_loggers_setting():
    exp = assemble(overrides=["trainer.logger=[console,tensorboard]"])
    assert build_config(exp).loggers == ("console", "tensorboard")
    assert tiny_config(loggers=("console", "mlflow")).loggers == ("console", "mlflow")


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_logger_without_its_package_is_refused_in_one_line(name, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda mod, *a: None if mod == name else real(mod, *a))
    assert _errors(tiny_config(loggers=("console", name))) == [
        f"loggers: {name!r} needs the {name} package: pip install {name}."]


def test_an_unknown_logger_is_refused_with_the_nearest_name():
    errors = _errors(tiny_config(loggers=("console", "wandbb")))
    assert len(errors) == 1 and "Did you mean 'wandb'" in errors[0], errors


def test_grpo_config_loggers_give_tunes_logger_callbacks():
    """The same names from `GRPOConfig().training(loggers=...)` give Ray's own callbacks."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    from ray.air.integrations.mlflow import MLflowLoggerCallback
    from ray.air.integrations.wandb import WandbLoggerCallback

    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    config = GRPOConfig().training(loggers=["console", "wandb", "mlflow"])
    assert logger_callbacks(("console", "tensorboard")) == []
    wandb_cb, mlflow_cb = logger_callbacks(config.loggers, "run1")
    assert isinstance(wandb_cb, WandbLoggerCallback) and wandb_cb.project == "run1"
    assert isinstance(mlflow_cb, MLflowLoggerCallback) and mlflow_cb.experiment_name == "run1"


def test_mlflow_gets_verls_names_with_at_renamed():
    """MLflow refuses '@' in a metric name (one such name ended the whole run): verl's rename."""
    assert mlflow_metric_name("val-core/arithmetic/acc/mean@1") == "val-core/arithmetic/acc/mean_at_1"
    assert mlflow_metric_name("critic/score/mean") == "critic/score/mean"


# ----------------------------------------------------------------------------- a real run
VERL_METRICS = ("critic/score/mean", "actor/pg_loss", "response_length/mean")


@pytest.fixture(scope="module")
def mlflow_run(tmp_path_factory):
    """Two iterations of `rllib train` with verl's ``trainer.logger=[console,mlflow]`` into
    the MLflow file store MLFLOW_TRACKING_URI names (mlflow 3 refuses file stores unless
    MLFLOW_ALLOW_FILE_STORE=true: not set here, `rllib train` allows the store named)."""
    pytest.importorskip("mlflow")

    root = tmp_path_factory.mktemp("loggers")
    env = {**{k: v for k, v in os.environ.items() if k != "MLFLOW_ALLOW_FILE_STORE"},
           "MLFLOW_TRACKING_URI": f"file:{root / 'mlruns'}", "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, "-m", "rllib_grpo.cli.main", "train", "--env", ENV,
           *TINY_VERL, "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=2", "trainer.experiment_name=logged",
           "trainer.logger=[console,mlflow]", "--storage-path", str(root / "runs"),
           *RAY_LIMITS]
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return root


@pytest.mark.slow  # about a minute: Ray start-up and two iterations
def test_a_real_run_logs_verls_metric_names_to_mlflow(mlflow_run):
    (run,) = [p for p in (mlflow_run / "mlruns").glob("*/*") if (p / "metrics").is_dir()]
    for name in VERL_METRICS:
        rows = (run / "metrics" / name).read_text().splitlines()
        assert [int(row.split()[2]) for row in rows] == [1, 2], (name, rows)  # one per step
    assert (run / "metrics" / "val-core/arithmetic/acc/mean_at_1").is_file()  # '@' renamed


# ----------------------------------------------------------------------------- W&B offline
def test_offline_wandb_bounds_the_wait_for_its_logging_actor(monkeypatch):
    """Tune waits up to the callback's ``upload_timeout`` (Ray's default 1800 s) for each
    logging actor's ``wandb.finish`` at the end of a run; offline nothing is uploaded, so a
    stuck actor holds the end of the run for `WANDB_LOCAL_FINISH_TIMEOUT_S` at most."""
    pytest.importorskip("wandb")
    from ray.air.integrations.wandb import DEFAULT_SYNC_TIMEOUT

    from rllib_grpo.cli.tune import WANDB_LOCAL_FINISH_TIMEOUT_S

    monkeypatch.setenv("WANDB_MODE", "offline")
    (offline,) = logger_callbacks(("console", "wandb"), "run1")
    assert offline._upload_timeout == WANDB_LOCAL_FINISH_TIMEOUT_S < DEFAULT_SYNC_TIMEOUT
    monkeypatch.setenv("WANDB_MODE", "online")
    (online,) = logger_callbacks(("console", "wandb"), "run1")
    assert online._upload_timeout == DEFAULT_SYNC_TIMEOUT


@pytest.mark.slow  # about a minute: Ray start-up and two iterations
def test_a_real_offline_wandb_run_ends_and_logs_verls_names(tmp_path):
    """`rllib train ... trainer.logger=[console,wandb]` with ``WANDB_MODE=offline`` runs to
    its end (it was reported to hang there) with output captured through pipes, as a CI
    job's, and the offline run holds verl's metric names."""
    pytest.importorskip("wandb")

    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path),
           "WANDB_SILENT": "true", "RAY_DEDUP_LOGS": "0"}
    cmd = [sys.executable, "-m", "rllib_grpo.cli.main", "train", "--env", ENV,
           *TINY_VERL, "actor_rollout_ref.actor.ppo_mini_batch_size=4",
           "trainer.total_training_steps=2", "trainer.experiment_name=logged",
           "trainer.logger=[console,wandb]", "--storage-path", str(tmp_path / "runs"),
           *RAY_LIMITS]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    (run,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    records = run.read_bytes()  # the run's protobuf records: metric names as plain bytes
    for name in (*VERL_METRICS, "val-core/arithmetic/acc/mean@1"):
        assert name.encode() in records, name
