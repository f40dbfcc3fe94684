"""Running `rllib train` through Tune: Ray start-up, resource and storage checks, the
Tuner, interrupts (a checkpoint, then exit 130 / 143), ``--resume`` and the final report
(one line per failed trial)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.experiment import ConfigError, Experiment
from rllib_grpo.logs import console_env, quiet_console
from rllib_grpo.rllib.config.gpu_layout import PlacementPlan, unplaceable

DEFAULT_MAX_FAILURES = 3  # restarts of a failed trial from its newest complete checkpoint

if TYPE_CHECKING:  # annotations only
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig


def run_tune(exp: Experiment, config: GRPOConfig, stop: dict[str, Any],
             args: argparse.Namespace) -> int:
    """Run the experiment with ``tune.Tuner``; print where results and checkpoints went."""
    _quiet_tune(args)
    import ray
    from ray import tune

    from rllib_grpo.cli.algorithms import resolve_algo
    from rllib_grpo.cli.resume import ContinueTrialResults, InterruptScheduler
    from rllib_grpo.cli.tune import (
        CompletionsTBXCallback,
        ProgressPrinter,
        TrialStartDeadline,
        install_completions,
        logger_callbacks,
    )
    from rllib_grpo.rllib.config.settings import defaults

    # (Another algorithm's config has no setting of its own: GRPO's default.)
    startup_timeout_s = float(getattr(config, "startup_timeout_s", None)
                              or defaults()["startup_timeout_s"])
    callbacks: list[Any] = [ProgressPrinter(), ContinueTrialResults(),
                            TrialStartDeadline(startup_timeout_s), *logger_callbacks(
                                getattr(config, "loggers", ()), exp.name)]
    if getattr(config, "log_completions_every", 0):
        install_completions(config)
        callbacks.append(CompletionsTBXCallback())
    algo_cls = resolve_algo(exp.algo)
    started = _init_ray(args)
    try:
        if started and not _cluster_address(args)[0]:
            check_resources(algo_cls, config, _nodes())
        tuner = tune.Tuner(
            algo_cls, param_space=config,
            tune_config=tune.TuneConfig(num_samples=exp.num_samples,
                                        scheduler=InterruptScheduler()),
            run_config=tune.RunConfig(
                name=exp.name, storage_path=_storage_path(exp.storage_path), stop=stop,
                callbacks=callbacks, verbose=args.verbose,
                failure_config=tune.FailureConfig(max_failures=DEFAULT_MAX_FAILURES if (
                    args.max_failures is None) else args.max_failures),
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=exp.checkpoint_freq,
                    checkpoint_at_end=exp.checkpoint_at_end,
                    num_to_keep=exp.num_to_keep or getattr(config, "keep_checkpoints", 0) or None)),
        )
        return _fit(tuner)
    finally:
        if started:
            ray.shutdown()


def _fit(tuner: Any) -> int:
    """``tuner.fit()`` with the interrupt handlers of `rllib_grpo.cli.resume`; the exit code."""
    from rllib_grpo.cli.resume import (
        install_interrupt_handlers,
        interrupted,
        restore_default_handlers,
    )
    from rllib_grpo.rllib.algorithm.deadlines import HangError

    install_interrupt_handlers()
    try:
        grid = tuner.fit()
    except HangError as error:  # a trial Tune could not start (TrialStartDeadline)
        print(f"rllib: error: {error}", file=sys.stderr)
        return 1
    finally:
        restore_default_handlers()
    code = report_results(grid)
    signum = interrupted()
    if signum is None:
        return code
    print(f"interrupted by {signal.Signals(signum).name}: each trial saved a checkpoint; "
          f"continue with: rllib train --resume {grid.experiment_path}", file=sys.stderr)
    return 128 + signum


def resume(args: argparse.Namespace, file: str | None, overrides: list[str]) -> int:
    """``rllib train --resume RUN_DIR``: continue every unfinished trial of a run."""
    given = [name for name, value in (("a config file", file), ("KEY=VALUE", overrides),
                                      ("--config", args.config), ("--env", args.env),
                                      ("--algo", args.algo), ("--stop", args.stop),
                                      ("--checkpoint-freq", args.checkpoint_freq),
                                      ("--storage-path", args.storage_path),
                                      ("--name", args.name), ("--num-samples", args.num_samples),
                                      ("--max-failures", args.max_failures))
             if value]
    if given:
        raise ConfigError(f"--resume continues a run as it was configured; drop {given[0]}")
    _quiet_tune(args)
    import ray
    from ray import tune

    from rllib_grpo.cli.algorithms import resolve_algo
    from rllib_grpo.cli.resume import prepare_resume, trainable_name

    path = str(Path(args.resume).expanduser().absolute())
    for line in prepare_resume(path):
        print(line, flush=True)
    algo_cls = resolve_algo(trainable_name(Path(path)))
    started = _init_ray(args)
    try:
        tuner = tune.Tuner.restore(path, trainable=algo_cls, resume_unfinished=True,
                                   resume_errored=True)
        return _fit(tuner)
    finally:
        if started:
            ray.shutdown()


def _quiet_tune(args: argparse.Namespace) -> None:
    """Before Ray starts: quiet console settings, which its workers (the trials, which import
    vLLM and transformers) inherit (`rllib_grpo.logs`); no Tune banner at ``--verbose 0``."""
    quiet_console(verbose=args.verbose >= 2)
    if args.verbose == 0:
        # Tune's newer console prints an experiment banner even at verbose 0; the classic
        # one prints nothing there (our progress lines and the final paths remain).
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")


def _cluster_address(args: argparse.Namespace) -> tuple[str | None, str]:
    """The Ray cluster to join and where that came from: ``--ray-address``, else
    ``$RAY_ADDRESS`` (as ``ray job submit`` sets it for its entrypoint), else none."""
    if args.ray_address:
        return args.ray_address, "--ray-address"
    address = os.environ.get("RAY_ADDRESS")
    return (address, "RAY_ADDRESS") if address else (None, "")


def _init_ray(args: argparse.Namespace) -> bool:
    """Start (or connect to) Ray unless it is up already; True if this call did."""
    import ray

    address, source = _cluster_address(args)
    # Checked first: a flag that contradicts another is an error whether or not Ray is up.
    sized = [f for f in ("num_cpus", "num_gpus", "object_store_memory") if getattr(args, f)]
    if address and sized:
        raise ConfigError(f"--{sized[0].replace('_', '-')} sizes a Ray started here; it "
                          f"cannot be used with {source}={address}")
    if ray.is_initialized():
        return False
    if address:
        print(f"joining the Ray cluster at {address} ({source})", flush=True)
        try:
            # Workers of an existing cluster do not inherit this process's environment.
            ray.init(address=address, runtime_env={"env_vars": console_env()},
                     logging_level=_ray_log_level(args))
        except ConnectionError as error:
            raise ConfigError(
                f"cannot join the Ray cluster at {address} ({source}): {error}. A cluster "
                "started by Ray 2.60 has token authentication on: run with RAY_AUTH_MODE=token "
                "where its token can be read, or start it with RAY_AUTH_MODE=disabled") from None
        return True
    running = _local_cluster()
    if running:
        print(f"note: a Ray cluster already runs on this machine ({running}); starting a "
              f"separate local Ray for this run. To run on that cluster instead: "
              f"--ray-address auto (or RAY_ADDRESS={running})", file=sys.stderr, flush=True)
    # Its workers inherit the console settings (`rllib_grpo.logs`) from this environment.
    ray.init(address="local", num_cpus=args.num_cpus, num_gpus=args.num_gpus,
             object_store_memory=args.object_store_memory, include_dashboard=False,
             logging_level=_ray_log_level(args))
    return True


def _local_cluster() -> str | None:
    """The address of a Ray cluster `ray start` launched on this machine, if one runs."""
    from ray._private.services import find_gcs_addresses

    try:
        addresses = find_gcs_addresses()
    except Exception:  # noqa: BLE001  (no ps access: assume none)
        return None
    return sorted(addresses)[0] if addresses else None


def _nodes() -> list[dict[str, float]]:
    """Each live node's CPUs and GPUs (of the Ray started here)."""
    import ray

    return [{k: float(v) for k, v in node["Resources"].items() if k in ("CPU", "GPU")}
            for node in ray.nodes() if node.get("Alive")]


def _ray_log_level(args: argparse.Namespace) -> int:
    """Ray's driver log level: WARNING unless ``--verbose 2`` or more."""
    import logging

    return logging.INFO if args.verbose >= 2 else logging.WARNING


def check_resources(algo_cls: Any, config: GRPOConfig, nodes: list[dict[str, float]]) -> None:
    """Refuse a trial that the Ray started here cannot place (Tune would wait for it
    forever): every process of the run in its bundle on one of ``nodes`` (each node's CPUs
    and GPUs), naming the process that finds no room."""
    try:
        request = algo_cls.default_resource_request(config)
    except Exception:  # noqa: BLE001  (a grid-search config: Tune resolves it per trial)
        return
    plan = (config.placement_plan() if hasattr(config, "placement_plan")  # GRPO's, named
            else PlacementPlan.of_bundles(request.bundles, request.strategy))  # RLlib's own
    why = unplaceable(plan, nodes)
    if why:
        raise ConfigError(f"one trial cannot be placed on this Ray ({len(nodes)} node(s): "
                          f"{', '.join(_amounts(n) for n in nodes)}): {why}; lower "
                          "num_env_runners / num_learners / num_reward_workers (and their "
                          "GPUs) or raise --num-cpus / --num-gpus")


def _amounts(node: dict[str, float]) -> str:
    return " ".join(f"{value:g} {key}" for key, value in sorted(node.items()))


def storage_path_error(path: str | None) -> str | None:
    """Why Tune could not write results under ``path``, or None (checked before Ray starts)."""
    if path is None or "://" in path:
        return None
    folder = Path(path).expanduser().absolute()
    for existing in (folder, *folder.parents):
        if existing.exists():
            if not existing.is_dir():
                return f"--storage-path {path}: {existing} is a file, not a folder"
            if not os.access(existing, os.W_OK | os.X_OK):
                return f"--storage-path {path}: {existing} is not writable"
            return None
    return None


def _storage_path(path: str | None) -> str | None:
    if path is None or "://" in path:
        return path
    return str(Path(path).expanduser().resolve())


def report_results(grid: Any) -> int:
    """Print each trial's checkpoint (or error) and the TensorBoard command; 1 if any failed."""
    failed = 0
    for result in grid:
        if result.error is not None:
            failed += 1
            print(f"trial {result.path} failed: {one_line_error(result.error)}",
                  file=sys.stderr)
        elif result.checkpoint is not None:
            print(f"checkpoint: {result.checkpoint.path}")
        else:
            print(f"no checkpoint for {result.path} (use --checkpoint-freq)")
    print(f"results: {grid.experiment_path}")
    print(f"TensorBoard: tensorboard --logdir {grid.experiment_path}")
    return 1 if failed else 0


def one_line_error(error: BaseException) -> str:
    """``Type: first line of the message`` of the innermost cause of a trial's error (Ray
    and Tune wrap it in exceptions whose text carries whole tracebacks)."""
    seen = set()
    while id(error) not in seen:
        seen.add(id(error))
        inner = getattr(error, "cause", None) or error.__cause__
        if not isinstance(inner, BaseException):
            break
        error = inner
    lines = [line for line in str(error).splitlines() if line.strip()]
    name = type(error).__name__.replace("RayTaskError(", "").rstrip(")")
    return f"{name}: {lines[-1] if lines and 'Traceback' in lines[0] else (lines or [''])[0]}"

