"""verl's ``trainer.logger`` / the ``loggers`` setting map onto Tune's logger callbacks; a
logger whose package is missing is refused before Ray starts, naming the pip command."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.tune import logger_callbacks
from tests.conftest import tiny_config


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


def test_names_map_to_tunes_logger_callbacks(monkeypatch):
    """wandb -> WandbLoggerCallback, mlflow -> MLflowLoggerCallback (Ray's classes, built
    lazily: stand-ins here, as neither package is installed in the test environment)."""
    made = {}
    for module, cls in [("ray.air.integrations.wandb", "WandbLoggerCallback"),
                        ("ray.air.integrations.mlflow", "MLflowLoggerCallback")]:
        fake = types.ModuleType(module)
        setattr(fake, cls, lambda cls=cls, **kwargs: made.setdefault(cls, kwargs) and cls)
        monkeypatch.setitem(sys.modules, module, fake)
    assert logger_callbacks(("console", "tensorboard")) == []
    assert logger_callbacks(["console", "wandb", "mlflow"], "run1") == [
        "WandbLoggerCallback", "MLflowLoggerCallback"]
    assert made == {"WandbLoggerCallback": {"project": "run1"},
                    "MLflowLoggerCallback": {"experiment_name": "run1"}}
