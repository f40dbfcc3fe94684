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
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ray import tune

from rllib_grpo.cli.console import progress_line, startup_line, waiting_line
from rllib_grpo.cli.tensorboard import completions_table
from rllib_grpo.rllib.algorithm.deadlines import HangError, read_waiting
from rllib_grpo.rllib.config.checks import allow_file_store, mlflow_tracking_uri
from rllib_grpo.rllib.config.gpu_layout import PlacementPlan, unplaceable

if TYPE_CHECKING:  # annotations only
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

COMPLETIONS_KEY = "completions"
COMPLETIONS_TAG = "completions"
COMPLETIONS_ROWS = 16
WAITING_POLL_S = 2.0  # how often the progress printer asks what the trials wait on
WAITING_REPEAT_S = 30.0  # a wait still going is shown again this often


class ProgressPrinter(tune.Callback):
    """Prints `rllib_grpo.cli.console.progress_line` for every result (the same line as the
    demo; trial names only with several trials), each trial's start-up time once, and,
    while a running trial waits longer than usual, what it waits on
    (`rllib_grpo.cli.console.waiting_line`, every `WAITING_REPEAT_S` while it lasts)."""

    def __init__(self) -> None:
        self._startup_shown: set[str] = set()
        self._next_poll = 0.0
        self._waiting_shown: dict[str, tuple[str, float]] = {}  # trial -> (wait, when shown)

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + WAITING_POLL_S
        for trial in trials:
            if trial.status != "RUNNING":
                continue
            waiting = read_waiting(trial.trial_id)
            if waiting is None:
                self._waiting_shown.pop(trial.trial_id, None)
                continue
            what, since = waiting
            shown = self._waiting_shown.get(trial.trial_id)
            if shown is not None and shown[0] == what and now - shown[1] < WAITING_REPEAT_S:
                continue
            self._waiting_shown[trial.trial_id] = (what, now)
            name = f"{trial}: " if len(trials) > 1 else ""
            print(waiting_line(what, time.time() - since, prefix=name), flush=True)

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict,
                        **info: Any) -> None:
        name = str(trial) if len(trials) > 1 else ""
        startup = startup_line(result)
        if startup and str(trial) not in self._startup_shown:
            self._startup_shown.add(str(trial))
            print(f"{name + ': ' if name else ''}{startup}", flush=True)
        print(progress_line(result, prefix=name + " " if name else ""), flush=True)


class TrialStartDeadline(tune.Callback):
    """Tune's start of a trial has a deadline (``startup_timeout_s``): a trial still
    waiting for its placement group that long, while no trial runs (none will free
    resources), stops the run with `HangError` naming what the group asks for and what the
    cluster has free, the Tune driver's stacks written to the experiment folder."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = float(timeout_s)
        self._pending_since: dict[str, float] = {}

    def on_step_end(self, iteration: int, trials: list, **info: Any) -> None:
        now = time.monotonic()
        if any(trial.status == "RUNNING" for trial in trials):
            self._pending_since.clear()  # the others wait for its resources
            return
        for trial in trials:
            if trial.status != "PENDING":
                self._pending_since.pop(trial.trial_id, None)
                continue
            since = self._pending_since.setdefault(trial.trial_id, now)
            if now - since > self.timeout_s:
                raise HangError(self._report(trial))

    def _report(self, trial: Any) -> str:
        from rllib_grpo.rllib import stacks

        factory = trial.placement_group_factory
        why = unplaceable(_trial_plan(trial), stacks.free_per_node()) or (
            "it fits the cluster's free resources now, yet Ray has not placed it")
        bundles = ", ".join("{" + ", ".join(f"{k}: {v:g}" for k, v in b.items()) + "}"
                            for b in factory.bundles)
        message = (f"trial {trial} did not start within {self.timeout_s:g} s "
                   f"(startup_timeout_s): its placement group ({bundles}) is not placed: "
                   f"{why}. Free those resources, grow the cluster, or make the trial "
                   "smaller (num_env_runners, num_learners, num_reward_workers, their "
                   "GPUs and custom resources)")
        run_id = f"tune-{trial.trial_id}"
        stacks.enable_stack_dumps(run_id, "rllib train (the Tune driver)")
        # The experiment's folder where it is local (the trial's own is not made yet).
        folder = Path(trial.path).parent if trial.path and "://" not in trial.path \
            else Path(trial.local_experiment_path)
        try:
            path = stacks.dump_stacks(run_id, folder / stacks.stack_file_name(), message)
        except OSError as error:
            return f"{message}; the stack file could not be written: {error}"
        finally:
            stacks.forget_run(run_id)
        return f"{message}. Python stacks of the Tune driver: {path}"


def _trial_plan(trial: Any) -> PlacementPlan:
    """The placement plan of ``trial``: GRPO's own (its processes named) where the trial's
    algorithm has one, else its placement group's plain bundles."""
    from ray.tune.registry import get_trainable_cls

    try:
        config = get_trainable_cls(trial.trainable_name).get_default_config() \
            .update_from_dict(trial.config)
        return config.placement_plan()
    except Exception:  # noqa: BLE001  (not GRPO, or not a config it can read)
        factory = trial.placement_group_factory
        return PlacementPlan.of_bundles(factory.bundles, factory.strategy)


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
