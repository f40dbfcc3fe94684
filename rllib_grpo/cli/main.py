"""The command line: ``rllib train`` (RLlib's classic command, for GRPO and the
built-in algorithms) and ``rllib-grpo explain`` (the resolved GRPO plan and its
pitfalls).

    rllib train --algo GRPO --env rllib_grpo/Arithmetic-v0 --config '{"lr": 1e-3}' \\
        --stop '{"training_iteration": 20}'
    rllib train file configs/cpu_demo.yaml
    rllib train file configs/dr_grpo.yaml actor_rollout_ref.rollout.n=4
    rllib-grpo explain configs/dr_grpo.yaml

Exit codes: 0 done; 1 a trial failed (train) or problems found (explain);
2 bad input (invalid JSON/YAML, unknown key, refused verl key, invalid setting).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rllib_grpo.cli.experiment import ConfigError, Experiment
from rllib_grpo.logs import console_env, quiet_console

TRAIN_EPILOG = """\
sources, later ones winning: the experiment file, --config, KEY=VALUE overrides, flags.
KEY may be a GRPO setting (prompts_per_step), an RLlib field (lr, num_learners,
env_config) or a verl dotted name (actor_rollout_ref.rollout.n); VALUE is read as
a YAML scalar (True, 1e-6, 5, [a,b]).

examples:
  rllib train file configs/cpu_demo.yaml
  rllib train file configs/dr_grpo.yaml data.train_batch_size=8 actor_rollout_ref.rollout.n=4 \\
      trainer.total_training_steps=5
  rllib train --algo GRPO --env rllib_grpo/Arithmetic-v0 \\
      --config '{"model_path": "builtin:demo", "lr": 1e-3, "env_config": {"max_operand": 4}}' \\
      --stop '{"training_iteration": 20}'
  rllib train --algo PPO --env CartPole-v1 --config '{"num_env_runners": 1}' \\
      --stop '{"training_iteration": 2}'

exit codes: 0 done, 1 a trial failed, 2 bad input (the message names the key).
"""

EXPLAIN_EPILOG = """\
examples:
  rllib-grpo explain configs/dr_grpo.yaml
  rllib-grpo explain algorithm.adv_estimator=grpo actor_rollout_ref.rollout.n=1

exit codes: 0 no errors or pitfalls, 1 errors or pitfalls found, 2 bad input.
"""


# ----------------------------------------------------------------------------- parser
def _add_source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("args", nargs="*", metavar="ARG",
                   help="[file] EXPERIMENT.yaml and/or KEY=VALUE overrides")
    p.add_argument("-f", "--config-file", metavar="YAML",
                   help="experiment file (same as the positional 'file YAML')")
    p.add_argument("--config", metavar="JSON", help="config settings as a JSON object")
    p.add_argument("--env", help="gymnasium env id (e.g. rllib_grpo/Arithmetic-v0, CartPole-v1)")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--algo", "--run", dest="algo", metavar="NAME",
                   help="algorithm: GRPO (default) or an RLlib built-in (PPO, APPO, ...)")
    p.add_argument("--stop", metavar="JSON",
                   help='stop criteria, e.g. \'{"training_iteration": 10}\'')
    p.add_argument("--checkpoint-freq", type=int, metavar="N",
                   help="checkpoint every N iterations (0 = only at the end; default 0)")
    p.add_argument("--storage-path", "--local-dir", dest="storage_path", metavar="DIR",
                   help="where Tune writes results and checkpoints (default ~/ray_results)")
    p.add_argument("--name", help="experiment name (a folder under the storage path)")
    p.add_argument("--num-samples", type=int, metavar="N", help="trials to run (default 1)")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="connect to this Ray cluster ('auto': $RAY_ADDRESS or the one `ray "
                        "start` launched here); default: start a new local Ray")
    p.add_argument("--num-cpus", type=int, metavar="N",
                   help="CPUs of the Ray started here (default: all)")
    p.add_argument("--num-gpus", type=int, metavar="N",
                   help="GPUs of the Ray started here (default: all)")
    p.add_argument("--object-store-memory", type=int, metavar="BYTES",
                   help="object store size of the Ray started here (default: Ray's)")
    p.add_argument("-v", "--verbose", type=int, default=0, choices=range(4),
                   help="Tune's own output 0-3 (default 0: none; 1: status tables and each "
                        "trial's config; 2 and 3 also restore vLLM/Ray/transformers INFO logs "
                        "and their known-harmless warnings, see rllib_grpo.logs); one "
                        "progress line per iteration is always printed")


def build_parser(prog: str = "rllib") -> argparse.ArgumentParser:
    """The ``train`` and ``explain`` commands."""
    parser = argparse.ArgumentParser(
        prog=prog, description="GRPO and RLlib's algorithms from the command line, "
                               "through Ray Tune.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{train,explain}")
    fmt = argparse.RawDescriptionHelpFormatter
    train = sub.add_parser(
        "train", help="train an algorithm with Ray Tune", formatter_class=fmt,
        description="Train with Ray Tune from flags, an experiment YAML in RLlib's classic\n"
                    "shape (<name>: {run, env, stop, config, checkpoint_config}) and/or\n"
                    "KEY=VALUE overrides. Prints a progress line per iteration, writes\n"
                    "TensorBoard logs and prints where the checkpoints went.",
        epilog=TRAIN_EPILOG)
    _add_source_args(train)
    _add_train_args(train)
    explain = sub.add_parser(
        "explain", help="print a GRPO config's resolved plan and its pitfalls",
        formatter_class=fmt, epilog=EXPLAIN_EPILOG,
        description="Resolve a GRPO config (experiment YAML, --config, KEY=VALUE overrides\n"
                    "in our or verl's names) and print what one training step does, with\n"
                    "every error and pitfall found. Nothing is trained.")
    _add_source_args(explain)
    return parser


def split_positionals(items: list[str], config_file: str | None) -> tuple[str | None, list[str]]:
    """``["file", "x.yaml", "a=1"]`` -> ``("x.yaml", ["a=1"])``."""
    items = list(items)
    file = config_file
    if items and items[0] == "file":
        if len(items) < 2:
            raise ConfigError("'file' needs the experiment YAML path after it")
        file, items = items[1], items[2:]
    overrides = []
    for item in items:
        if "=" in item:
            overrides.append(item)
        elif item.startswith("-"):
            raise ConfigError(f"unrecognized option {item!r} (see --help)")
        elif file is None and item.endswith((".yaml", ".yml", ".json")):
            file = item
        else:
            raise ConfigError(f"unexpected argument {item!r}: expected KEY=VALUE")
    return file, overrides


# ----------------------------------------------------------------------------- train
def assemble_from_args(args: argparse.Namespace, file: str | None,
                       overrides: list[str]) -> Experiment:
    """The experiment the parsed arguments describe (keys checked, nothing built)."""
    from rllib_grpo.cli.build import assemble

    train = args.command == "train"
    return assemble(
        file, overrides, config_json=args.config, env=args.env,
        stop_json=args.stop if train else None, algo=args.algo if train else None,
        name=args.name if train else None,
        storage_path=args.storage_path if train else None,
        checkpoint_freq=args.checkpoint_freq if train else None,
        num_samples=args.num_samples if train else None,
    )


def key_report(exp: Experiment) -> list[str]:
    """Lines naming the verl keys that were mapped onto run settings or ignored."""
    lines = [f"verl key mapped: {line}" for line in exp.mapped]
    if exp.ignored:
        lines.append("verl keys ignored (no effect here, see rllib_grpo.cli.experiment.VERL_IGNORED): "
                     + ", ".join(exp.ignored))
    return lines


def run_summary(exp: Experiment, config: Any, stop: dict[str, Any]) -> list[str]:
    """What is about to run, in two lines."""
    what = f"{exp.algo} on {config.env}"
    if exp.algo == "GRPO":
        what += (f": model {config.model_path}, {config.prompts_per_step} prompts x group_size "
                 f"{config.group_size} per step")
    every = f"every {exp.checkpoint_freq} iterations" if exp.checkpoint_freq else ""
    end = "at the end" if exp.checkpoint_at_end else ""
    ckpt = " and ".join(p for p in (every, end) if p) or "none"
    return [what, f"stop: {stop or 'none (runs until interrupted)'}; checkpoints: {ckpt}; "
                  f"trials: {exp.num_samples}"]


def train(args: argparse.Namespace, file: str | None, overrides: list[str]) -> int:
    """``rllib train``: check everything, then run the experiment through Tune."""
    from rllib_grpo.cli.build import build_config, config_errors, resolve_stop

    exp = assemble_from_args(args, file, overrides)
    config = build_config(exp)
    errors = config_errors(exp)
    if errors:
        raise ConfigError("invalid config: " + " | ".join(errors))
    stop = resolve_stop(exp, config)
    for line in key_report(exp) + run_summary(exp, config, stop):
        print(line, flush=True)
    return run_tune(exp, config, stop, args)


def run_tune(exp: Experiment, config: Any, stop: dict[str, Any],
             args: argparse.Namespace) -> int:
    """Run the experiment with ``tune.Tuner``; print where results and checkpoints went."""
    # Before Ray starts: its workers (the trials, which import vLLM and transformers)
    # inherit these settings (`rllib_grpo.logs`).
    quiet_console(verbose=args.verbose >= 2)
    if args.verbose == 0:
        # Tune's newer console prints an experiment banner even at verbose 0; the classic
        # one prints nothing there (our progress lines and the final paths remain).
        os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    import ray
    from ray import tune

    from rllib_grpo.cli.algorithms import resolve_algo
    from rllib_grpo.cli.tune import CompletionsTBXCallback, ProgressPrinter, install_completions

    callbacks: list[Any] = [ProgressPrinter()]
    if getattr(config, "log_completions_every", 0):
        install_completions(config)
        callbacks.append(CompletionsTBXCallback())
    algo_cls = resolve_algo(exp.algo)
    started = _init_ray(args)
    try:
        if started and not args.ray_address:
            check_resources(algo_cls, config, ray.cluster_resources())
        tuner = tune.Tuner(
            algo_cls, param_space=config,
            tune_config=tune.TuneConfig(num_samples=exp.num_samples),
            run_config=tune.RunConfig(
                name=exp.name, storage_path=_storage_path(exp.storage_path), stop=stop,
                callbacks=callbacks, verbose=args.verbose,
                checkpoint_config=tune.CheckpointConfig(
                    checkpoint_frequency=exp.checkpoint_freq,
                    checkpoint_at_end=exp.checkpoint_at_end, num_to_keep=exp.num_to_keep)),
        )
        return report_results(tuner.fit())
    finally:
        if started:
            ray.shutdown()


def _init_ray(args: argparse.Namespace) -> bool:
    """Start (or connect to) Ray unless it is up already; True if this call did."""
    import ray

    if ray.is_initialized():
        return False
    if args.ray_address:
        sized = [f for f in ("num_cpus", "num_gpus", "object_store_memory") if getattr(args, f)]
        if sized:
            raise ConfigError(f"--{sized[0].replace('_', '-')} sizes a Ray started here; it "
                              "cannot be used with --ray-address")
        # Workers of an existing cluster do not inherit this process's environment.
        ray.init(address=args.ray_address,
                 runtime_env={"env_vars": console_env()}, logging_level=_ray_log_level(args))
        return True
    # A new local Ray, even when RAY_ADDRESS is set or a `ray start` cluster runs here.
    # Its workers inherit the console settings (`rllib_grpo.logs`) from this environment.
    ray.init(address="local", num_cpus=args.num_cpus, num_gpus=args.num_gpus,
             object_store_memory=args.object_store_memory, include_dashboard=False,
             logging_level=_ray_log_level(args))
    return True


def _ray_log_level(args: argparse.Namespace) -> int:
    """Ray's driver log level: WARNING unless ``--verbose 2`` or more."""
    import logging

    return logging.INFO if args.verbose >= 2 else logging.WARNING


def check_resources(algo_cls: type, config: Any, available: dict[str, float]) -> None:
    """Refuse a trial larger than the Ray started here (Tune would wait for it forever)."""
    try:
        need = algo_cls.default_resource_request(config).required_resources
    except Exception:  # noqa: BLE001  (a grid-search config: Tune resolves it per trial)
        return
    short = {k: v for k, v in need.items() if v > available.get(k, 0.0)}
    if short:
        wanted = ", ".join(f"{v:g} {k}" for k, v in short.items())
        have = ", ".join(f"{available.get(k, 0.0):g} {k}" for k in short)
        raise ConfigError(f"one trial needs {wanted} but this Ray has {have}: lower "
                          "num_env_runners / num_learners (and their GPUs) or raise "
                          "--num-cpus / --num-gpus")


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
            print(f"trial {result.path} failed: {result.error}", file=sys.stderr)
        elif result.checkpoint is not None:
            print(f"checkpoint: {result.checkpoint.path}")
        else:
            print(f"no checkpoint for {result.path} (use --checkpoint-freq)")
    print(f"results: {grid.experiment_path}")
    print(f"TensorBoard: tensorboard --logdir {grid.experiment_path}")
    return 1 if failed else 0


# ----------------------------------------------------------------------------- explain
def describe_run(exp: Experiment, config: Any) -> list[str]:
    """The experiment around the config: env, stop, checkpoints, verl keys."""
    from rllib_grpo.cli.build import count_prompts, resolve_stop

    try:
        stop = str(resolve_stop(exp, config) or "none (runs until interrupted)")
    except ConfigError:
        try:
            count_prompts(config)
            reason = ""
        except ConfigError as err:
            reason = f"; {err}"
        stop = (f"{exp.stop or ''} training_iteration = {exp.total_epochs} epochs x (prompts // "
                f"prompts_per_step), counted when training starts{reason}").strip()
    every = f"every {exp.checkpoint_freq} iterations" if exp.checkpoint_freq else ""
    end = "at the end" if exp.checkpoint_at_end else ""
    lines = [
        f"experiment: {exp.name or '(default name)'}   algorithm: {exp.algo}",
        f"env: {config.env}   env_config: {dict(config.env_config)}",
        f"stop: {stop}",
        f"checkpoints: {' and '.join(p for p in (every, end) if p) or 'none'}",
    ]
    return lines + key_report(exp)


def explain(args: argparse.Namespace, file: str | None, overrides: list[str]) -> int:
    """``rllib-grpo explain``: print the plan (per grid point); exit 1 on errors or pitfalls."""
    from rllib_grpo.cli.build import build_config, grid_points
    from rllib_grpo.rllib.checks import find_errors, find_pitfalls

    exp = assemble_from_args(args, file, overrides)
    if exp.algo != "GRPO":
        raise ConfigError(f"explain covers GRPO configs; this experiment runs {exp.algo!r}")
    points = grid_points(exp)
    print("\n".join(describe_run(exp, build_config(exp, points[0]))))
    problems = False
    for point in points:
        config = build_config(exp, point)
        if point:
            print(f"--- grid point {point}")
        print(config.explain())
        problems = problems or bool(find_errors(config) or find_pitfalls(config))
    return 1 if problems else 0


# ----------------------------------------------------------------------------- entry points
def main(argv: list[str] | None = None, prog: str = "rllib") -> int:
    """Parse and run one command; bad input is one line on stderr and exit code 2."""
    parser = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    try:
        file, overrides = split_positionals(args.args + extra, args.config_file)
        if file is not None and not Path(file).is_file():
            raise ConfigError(f"{file}: no such file")
        command = train if args.command == "train" else explain
        return command(args, file, overrides)
    except ConfigError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2


def rllib_main() -> None:
    """Console script ``rllib``."""
    raise SystemExit(main(prog="rllib"))


def grpo_main() -> None:
    """Console script ``rllib-grpo``."""
    raise SystemExit(main(prog="rllib-grpo"))


if __name__ == "__main__":
    raise SystemExit(main(prog="rllib"))

