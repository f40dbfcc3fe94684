"""The door for ``loggers=[..., mlflow]``: MLflow 3 refuses a file store unless
``MLFLOW_ALLOW_FILE_STORE=true`` and otherwise defaults to ``sqlite:///mlflow.db``, which
needs sqlalchemy and alembic (mlflow-skinny has neither).  Both were found only after Ray
started; now `validate()`, `explain` and `rllib train` refuse the store that cannot work, in
one line naming the fix, and a file store the user names is allowed for them."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests.conftest import tiny_config

pytest.importorskip("mlflow")


def _errors(config) -> list[str]:
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(config)


def _packages(monkeypatch, *, present: bool) -> None:
    """sqlalchemy and alembic present or absent (the real ones are absent in this venv)."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        object() if present else None) if name in ("sqlalchemy", "alembic") else real(name, *a))


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """An empty working folder (MLflow's default store depends on ./mlruns) and no MLflow
    variables from the caller."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # setenv first, so that monkeypatch records the variable and removes what the code under
    # test writes into os.environ (delenv of an absent variable records nothing).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    return tmp_path


def test_mlflows_default_sqlite_store_without_sqlalchemy_is_refused(in_tmp, monkeypatch):
    _packages(monkeypatch, present=False)
    errors = _errors(tiny_config(loggers=("console", "mlflow")))
    assert len(errors) == 1, errors
    assert errors[0].startswith(f"loggers: 'mlflow' logs to sqlite:///{in_tmp}/mlflow.db ")
    assert "needs sqlalchemy and alembic" in errors[0]
    assert "pip install sqlalchemy alembic, or set MLFLOW_TRACKING_URI=file:./mlruns" in errors[0]


def test_a_database_store_with_sqlalchemy_passes(in_tmp, monkeypatch):
    _packages(monkeypatch, present=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "postgresql+psycopg2://db/mlflow")
    assert _errors(tiny_config(loggers=("console", "mlflow"))) == []


@pytest.mark.parametrize("uri", ["http://localhost:5000", "https://mlflow.example.org",
                                 "databricks"])
def test_a_tracking_server_passes(uri, in_tmp, monkeypatch):
    _packages(monkeypatch, present=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert _errors(tiny_config(loggers=("console", "mlflow"))) == []


def test_a_named_file_store_passes_and_is_allowed_for_mlflow(in_tmp, monkeypatch):
    """The file store the user names passes the door, and the callback sets
    MLFLOW_ALLOW_FILE_STORE=true for it, so MLflow 3 opens it."""
    from mlflow.store.tracking.file_store import FileStore

    from rllib_grpo.cli.tune import logger_callbacks

    _packages(monkeypatch, present=False)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"file:{in_tmp / 'mlruns'}")
    assert _errors(tiny_config(loggers=("console", "mlflow"))) == []
    with pytest.raises(Exception, match="MLFLOW_ALLOW_FILE_STORE=true"):
        FileStore(str(in_tmp / "mlruns"))  # what Tune's callback met before
    logger_callbacks(("console", "mlflow"), "run1")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    FileStore(str(in_tmp / "mlruns"))  # now MLflow opens it


def test_a_file_store_with_the_variable_set_false_is_refused(in_tmp, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", str(in_tmp / "mlruns"))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    assert _errors(tiny_config(loggers=("console", "mlflow"))) == [
        f"loggers: 'mlflow' logs to the file store {in_tmp / 'mlruns'}, which MLflow refuses "
        "with MLFLOW_ALLOW_FILE_STORE=false; unset it or set MLFLOW_ALLOW_FILE_STORE=true."]


def test_without_mlflow_in_loggers_the_store_is_not_checked(in_tmp, monkeypatch):
    _packages(monkeypatch, present=False)
    assert _errors(tiny_config(loggers=("console", "tensorboard"))) == []


def test_validate_explain_and_rllib_train_refuse_the_sqlite_default(in_tmp, monkeypatch, capsys):
    from rllib_grpo.cli.main import main

    _packages(monkeypatch, present=False)
    config = tiny_config(loggers=("console", "mlflow"))
    with pytest.raises(ValueError, match="needs sqlalchemy and alembic"):
        config.validate()
    assert "needs sqlalchemy and alembic" in config.explain()
    argv = ["train", "model_path=builtin:tiny", "group_size=2", "trainer.logger=[console,mlflow]"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        "rllib: error: invalid config: loggers: 'mlflow' logs to sqlite:///"), err
