"""Ray Tune hooks of `rllib train`: a progress line per iteration (`rllib_grpo.cli.console`),
and sampled completions in TensorBoard.

Tune's TensorBoard logger writes numbers only, so completions take two small hooks:

* `add_completions` (an RLlib ``on_train_result`` callable, in the trial's
  process): every ``log_completions_every`` iterations it puts a markdown table of
  the last rollout's prompts, responses and rewards into the result under
  ``"completions"``;
* `CompletionsTBXCallback` (a Tune callback, on the driver): writes that text
  with tensorboardX into the trial's log folder, next to Tune's own event file.

`install_completions(config)` adds the first to a GRPO config; pass the second
to ``tune.RunConfig(callbacks=[...])``.  `rllib train` does both.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from ray import tune

from rllib_grpo.cli.console import progress_line, startup_line
from rllib_grpo.cli.tensorboard import completions_table
from rllib_grpo.rllib.config.door_checks import allow_file_store, mlflow_tracking_uri

if TYPE_CHECKING:  # annotations only
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

COMPLETIONS_KEY = "completions"
COMPLETIONS_TAG = "completions"
COMPLETIONS_ROWS = 16


class ProgressPrinter(tune.Callback):
    """Prints `rllib_grpo.cli.console.progress_line` for every result (the same line as the
    demo; trial names only with several trials), and each trial's start-up time once."""

    def __init__(self) -> None:
        self._startup_shown: set[str] = set()

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        name = str(trial) if len(trials) > 1 else ""
        startup = startup_line(result)
        if startup and str(trial) not in self._startup_shown:
            self._startup_shown.add(str(trial))
            print(f"{name + ': ' if name else ''}{startup}", flush=True)
        print(progress_line(result, prefix=name + " " if name else ""), flush=True)


def add_completions(*, algorithm: Any, result: dict, **kwargs: Any) -> None:
    """RLlib ``on_train_result`` hook: the completions table into ``result`` every N steps."""
    every = int(getattr(algorithm.config, "log_completions_every", 0) or 0)
    rollout = getattr(algorithm, "last_rollout", None)
    iteration = int(result.get("training_iteration", 0))
    if every <= 0 or rollout is None or not rollout.infos or iteration % every:
        return
    result[COMPLETIONS_KEY] = completions_table(rollout.infos, limit=COMPLETIONS_ROWS)


def install_completions(config: GRPOConfig) -> Any:
    """Add `add_completions` to the config's ``on_train_result`` callables (idempotent)."""
    existing = config.callbacks_on_train_result
    hooks = list(existing) if isinstance(existing, list | tuple) else (
        [] if existing is None else [existing])
    if add_completions not in hooks:
        config.callbacks(on_train_result=[*hooks, add_completions])
    return config


def logger_callbacks(loggers: tuple[str, ...] | list[str] | str,
                     experiment: str | None = None) -> list[Any]:
    """Tune's logger callbacks for the ``loggers`` setting (verl's ``trainer.logger``):
    ``wandb`` -> `WandbLoggerCallback`, ``mlflow`` -> `MLflowLoggerCallback`, both named
    after the experiment; ``console`` (`ProgressPrinter`) and ``tensorboard`` (Tune's own
    TBX logger) are always on.  Their packages are checked before Ray starts (the door)."""
    names = [loggers] if isinstance(loggers, str) else list(loggers)
    callbacks: list[Any] = []
    if "wandb" in names:
        from ray.air.integrations.wandb import WandbLoggerCallback

        callbacks.append(WandbLoggerCallback(project=experiment or "rllib-grpo",
                                             upload_timeout=wandb_upload_timeout()))
    if "mlflow" in names:
        callbacks.append(_mlflow_callback(experiment or "rllib-grpo"))
    return callbacks


# How long the end of a run waits for W&B's logging actors to finish (`wandb.finish`) when
# nothing is uploaded (``WANDB_MODE=offline`` / ``disabled``: the run is written locally).
# Ray's default, 1800 s, is for uploads; a logging actor that never finishes would hold the
# end of the run that long.
WANDB_LOCAL_FINISH_TIMEOUT_S = 120


def wandb_upload_timeout() -> int:
    """`WandbLoggerCallback`'s ``upload_timeout``: Ray's default online, a bound of
    `WANDB_LOCAL_FINISH_TIMEOUT_S` where W&B writes locally only."""
    from ray.air.integrations.wandb import DEFAULT_SYNC_TIMEOUT

    local = os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
    return WANDB_LOCAL_FINISH_TIMEOUT_S if local else int(DEFAULT_SYNC_TIMEOUT)


def mlflow_metric_name(name: str) -> str:
    """verl's MLflow rename: ``@`` (as in ``val-core/.../mean@4``), which MLflow refuses in
    a metric name, becomes ``_at_``; every other verl name is valid as it is."""
    return name.replace("@", "_at_")


def _mlflow_callback(experiment: str) -> Any:
    """Tune's `MLflowLoggerCallback`, logging each result under `mlflow_metric_name`
    (one refused name would otherwise end the whole run), into the store
    `mlflow_tracking_uri` names (a file store allowed: `allow_file_store`)."""
    allow_file_store(mlflow_tracking_uri())
    from ray._private.dict import flatten_dict
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class VerlNamesMLflowLoggerCallback(MLflowLoggerCallback):
        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            super().log_trial_result(iteration, trial, {
                mlflow_metric_name(k): v for k, v in flatten_dict(result).items()})

    return VerlNamesMLflowLoggerCallback(experiment_name=experiment)


class CompletionsTBXCallback(tune.Callback):
    """Writes ``result["completions"]`` as TensorBoard text into each trial's folder."""

    def __init__(self) -> None:
        self._writers: dict[str, Any] = {}  # trial folder -> SummaryWriter

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        text = result.get(COMPLETIONS_KEY)
        if not text:
            return
        folder = str(trial.local_path)
        writer = self._writers.get(folder)
        if writer is None:
            from tensorboardX import SummaryWriter

            writer = SummaryWriter(folder, filename_suffix=".completions")
            self._writers[folder] = writer
        writer.add_text(COMPLETIONS_TAG, text, int(result.get("training_iteration", iteration)))
        writer.flush()

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info: Any) -> None:
        self._close(trial)

    def on_experiment_end(self, trials: list, **info: Any) -> None:
        for folder in list(self._writers):
            self._writers.pop(folder).close()

    def _close(self, trial: Any) -> None:
        writer = self._writers.pop(str(trial.local_path), None)
        if writer is not None:
            writer.close()
