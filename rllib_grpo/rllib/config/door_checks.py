"""The door's checks that load something small before any process starts: the env id
exists, counts are >= 0, and the reward function imports and returns a number on a sample
built from the first row (in a child process: `rllib_grpo.rewards.probe`).  `rllib_grpo.rllib.config.input_checks.input_errors` includes
them, so `GRPOConfig.validate`, `explain` and `rllib train` refuse the same inputs.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from pathlib import Path
from typing import Any

from rllib_grpo.rllib.config.settings import (
    LOGGER_PACKAGES,
    GRPOSettings,
    choice_error,
    did_you_mean,
)

# Process and device counts (RLlib's own fields): a negative one is accepted by RLlib.
COUNT_FIELDS = ("num_env_runners", "num_envs_per_env_runner", "num_learners",
                "num_gpus_per_learner", "num_cpus_per_learner", "num_gpus_per_env_runner",
                "num_cpus_per_env_runner", "evaluation_num_env_runners", "num_epochs")


def count_errors(c: GRPOSettings) -> list[str]:
    """Every count is >= 0 (``"auto"`` and other non-numbers are RLlib's to judge)."""
    errors = []
    for field in COUNT_FIELDS:
        value = getattr(c, field, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            errors.append(f"{field}={value!r} must be >= 0.")
    return errors


def env_id_error(env: Any) -> str | None:
    """An env given by name must be a gymnasium id, a Tune-registered name or an
    importable ``module.Class``; the nearest gymnasium ids are suggested."""
    if not isinstance(env, str):
        return None
    import gymnasium

    if env in gymnasium.registry or _tune_registered(env) or _importable(env):
        return None
    return f"env={env!r} is no registered gymnasium id nor env class." + did_you_mean(
        env, gymnasium.registry)


def _tune_registered(name: str) -> bool:
    from ray.tune.registry import ENV_CREATOR, _global_registry

    return bool(_global_registry.contains(ENV_CREATOR, name))


def _importable(path: str) -> bool:
    module, _, name = path.replace(":", ".").rpartition(".")
    try:
        return module != "" and isinstance(getattr(importlib.import_module(module), name, None),
                                           type)
    except Exception:  # noqa: BLE001  (not a module path: not an env class)
        return False


def _user_reward_fns(c: GRPOSettings) -> list[tuple[str, str, dict]]:
    """``(field, spec, env settings)`` of each reward function given as ``"module:function"``
    or ``"file.py:function"`` in ``env_config`` / ``val_env_config`` whose file exists
    (`input_checks` names a missing one); registered names, None and callables are not
    user code the door imports."""
    found = []
    for field in ("env_config", "val_env_config"):
        settings = getattr(c, field, None) or {}
        spec = settings.get("reward_fn")
        if not isinstance(spec, str) or ":" not in spec:
            continue
        file = spec.rpartition(":")[0]
        if file.endswith(".py") and not Path(file).expanduser().is_file():
            continue
        found.append((field, spec, settings))
    return found


def reward_fn_errors(c: GRPOSettings) -> list[str]:
    """Each user reward function (`_user_reward_fns`) imports and, called once on a
    sample built from the first row of the data, returns a number or a dict with
    ``"score"``, without killing its process and in time (`_probe_timeout_s`).  The call runs
    in a child process (`rllib_grpo.rewards.probe`): none of the user's code runs here.
    A call that raises is left to run time (that sample scores 0)."""
    from rllib_grpo.rewards.probe import probe_reward_fn

    errors = []
    for field, spec, settings in _user_reward_fns(c):
        problem = probe_reward_fn(spec, _first_row_sample(settings),
                                  dict(settings.get("reward_kwargs") or {}),
                                  timeout_s=_probe_timeout_s(settings))
        if problem:
            errors.append(f"{field}.reward_fn={spec!r}: {problem}.")
    return errors


def _probe_timeout_s(settings: dict) -> float:
    """The door's limit on the child (start, import and one call): `PROBE_TIMEOUT_S`, plus
    the run's own limit on one call (``reward_timeout_s``) where that is longer."""
    from rllib_grpo.rewards.probe import PROBE_TIMEOUT_S

    per_call = settings.get("reward_timeout_s")
    if isinstance(per_call, int | float) and not isinstance(per_call, bool) and \
            per_call > PROBE_TIMEOUT_S:
        return PROBE_TIMEOUT_S + float(per_call)
    return PROBE_TIMEOUT_S


def reward_fn_probe_lines(c: GRPOSettings) -> list[str]:
    """``explain``'s line per user reward function: the door calls it once, and where."""
    return [f"reward check:                  {field}.reward_fn {spec!r} is imported and called "
            "once on the first row (its ground truth as the response), in a child process, "
            f"{_probe_timeout_s(settings):g} s at most" for field, spec, settings in
            _user_reward_fns(c)]


def _first_row_sample(settings: dict) -> tuple[str, str, Any, dict | None]:
    """``(data_source, solution_str, ground_truth, extra_info)`` from the first row of the
    data file (the ground truth as the response), or an empty sample without a file."""
    path = settings.get("path")
    path = path[0] if isinstance(path, list | tuple) and path else path
    if not isinstance(path, str):
        return "", "", "", None
    from rllib_grpo.envs.datasets import load_prompts

    try:
        first = load_prompts(path, prompt_key=settings.get("prompt_key", "prompt"))[0]
    except Exception:  # noqa: BLE001  (the data's own checks report it)
        return "", "", "", None
    return first.data_source, str(first.ground_truth), first.ground_truth, first.extra_info


def logger_errors(c: GRPOSettings) -> list[str]:
    """Every name in ``loggers`` is known, its package is installed, and MLflow's tracking
    store is usable (`mlflow_store_error`)."""
    loggers = getattr(c, "loggers", ())
    names = [loggers] if isinstance(loggers, str) else list(loggers or ())
    errors = []
    for name in names:
        if error := choice_error("loggers", name, LOGGER_PACKAGES, note=" (any of them)"):
            errors.append(error)
        elif (package := LOGGER_PACKAGES[name]) and importlib.util.find_spec(package) is None:
            errors.append(f"loggers: {name!r} needs the {package} package: pip install {package}.")
        elif name == "mlflow" and (error := mlflow_store_error(mlflow_tracking_uri())):
            errors.append(error)
    return errors


# MLflow's database stores (SQLAlchemy URIs, ``dialect+driver://``): they need sqlalchemy
# and alembic, which mlflow-skinny does not install.
MLFLOW_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
MLFLOW_DB_PACKAGES = ("sqlalchemy", "alembic")
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def mlflow_tracking_uri() -> str:
    """The store Tune's `MLflowLoggerCallback` logs to (it passes no URI of its own):
    ``MLFLOW_TRACKING_URI``, else MLflow's default (``sqlite:///mlflow.db`` in the working
    folder since MLflow 3; ``./mlruns`` where that already holds runs)."""
    import mlflow

    return str(mlflow.get_tracking_uri())


def is_file_store(uri: str) -> bool:
    """``file:`` URIs and plain paths (MLflow's file store)."""
    from urllib.parse import urlparse

    return urlparse(uri).scheme in ("", "file")


def mlflow_store_error(uri: str) -> str | None:
    """The one-line refusal of a tracking store MLflow would refuse after Ray started:

    * a file store when ``MLFLOW_ALLOW_FILE_STORE`` is set false (MLflow 3 refuses file
      stores unless it is true; left unset, `allow_file_store` sets it for the store named);
    * a database store (MLflow's default ``sqlite:///mlflow.db`` included) without
      sqlalchemy and alembic (mlflow-skinny has neither);

    None for a usable one (HTTP servers, Databricks and other schemes are MLflow's to judge)."""
    from urllib.parse import urlparse

    if is_file_store(uri):
        value = os.environ.get(ALLOW_FILE_STORE)
        if value is not None and value.strip().lower() not in ("true", "1"):
            return (f"loggers: 'mlflow' logs to the file store {uri}, which MLflow refuses with "
                    f"{ALLOW_FILE_STORE}={value}; unset it or set {ALLOW_FILE_STORE}=true.")
        return None
    dialect = urlparse(uri).scheme.split("+")[0]
    missing = [p for p in MLFLOW_DB_PACKAGES if importlib.util.find_spec(p) is None]
    if dialect in MLFLOW_DB_SCHEMES and missing:
        return (f"loggers: 'mlflow' logs to {uri} (MLFLOW_TRACKING_URI, else MLflow's default "
                f"store), which needs {' and '.join(missing)} (mlflow-skinny lacks them): "
                f"pip install {' '.join(missing)}, or set MLFLOW_TRACKING_URI=file:./mlruns "
                "(a file store) or http://<host>:<port> (a tracking server).")
    return None


def allow_file_store(uri: str) -> None:
    """Let MLflow 3 use the file store ``uri`` names (it refuses file stores unless
    ``MLFLOW_ALLOW_FILE_STORE`` is true); an explicit setting of the variable is kept."""
    if is_file_store(uri):
        os.environ.setdefault(ALLOW_FILE_STORE, "true")
