"""The command line: ``rllib train`` (RLlib's classic command, for GRPO and the
built-in algorithms), ``rllib-grpo explain`` (the resolved GRPO plan and its
pitfalls), ``rllib-grpo export`` (a checkpoint as a Hugging Face model folder,
`rllib_grpo.cli.export_command`) and ``rllib-grpo eval`` (verl's validation metrics of a
model or checkpoint, `rllib_grpo.cli.eval_command`).

    rllib train --algo GRPO --env rllib_grpo/Arithmetic-v0 --config '{"lr": 1e-3}' \\
        --stop '{"training_iteration": 20}'
    rllib train file configs/cpu_demo.yaml
    rllib train file configs/dr_grpo.yaml actor_rollout_ref.rollout.n=4
    rllib-grpo explain configs/dr_grpo.yaml
    rllib-grpo export demo_output/checkpoint /tmp/demo_model
    rllib-grpo eval /tmp/demo_model --env rllib_grpo/Arithmetic-v0 --env-config '{"max_operand": 4}'
    rllib train --resume ~/ray_results/GRPO_2026-11-30_12-00-00

Exit codes: 0 done; 1 a trial failed (train) or problems found (explain);
2 bad input (invalid JSON/YAML, unknown key, refused verl key, invalid setting);
130 / 143 interrupted by SIGINT / SIGTERM (after saving a checkpoint; --resume continues).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.dry_run import (
    add_dry_run_parser,
    add_gpu_memory_arg,
    run_dry_run,
    with_gpu_memory,
)
from rllib_grpo.cli.eval_command import add_eval_parser, run_eval
from rllib_grpo.cli.experiment import ConfigError, Experiment
from rllib_grpo.cli.export_command import add_export_parser, run_export
from rllib_grpo.cli.run import (  # noqa: F401  (check_resources, one_line_error: public API)
    check_resources,
    one_line_error,
    resume,
    run_tune,
    storage_path_error,
)

if TYPE_CHECKING:  # annotations only
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

# Commands that take their own arguments (no experiment sources).
SELF_CONTAINED_COMMANDS = {"export": run_export, "eval": run_eval}

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
  rllib train --resume ~/ray_results/GRPO_2026-11-30_12-00-00

Ctrl+C (SIGINT) or SIGTERM: every trial finishes its iteration, saves a checkpoint and
pauses; --resume RUN_DIR continues each trial from its newest complete checkpoint whose
results are recorded (result.json and progress.csv keep each iteration once).

exit codes: 0 done, 1 a trial failed, 2 bad input (the message names the key),
130 / 143 interrupted by SIGINT / SIGTERM.
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
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue an interrupted or failed run (the 'results:' folder it "
                        "printed) from each trial's newest complete checkpoint whose results "
                        "are recorded; takes no config, only the Ray options")
    p.add_argument("--num-samples", type=int, metavar="N", help="trials to run (default 1)")
    p.add_argument("--max-failures", type=int, metavar="N",
                   help="restart a failed trial (a lost learner, env runner or node) from its "
                        "newest complete checkpoint up to N times (default 3; 0: never; "
                        "-1: always)")
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
    """The ``train``, ``explain``, ``export`` and ``eval`` commands."""
    parser = argparse.ArgumentParser(
        prog=prog, description="GRPO and RLlib's algorithms from the command line, "
                               "through Ray Tune.")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{train,explain,dry-run,export,eval}")
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
    add_gpu_memory_arg(explain)
    add_export_parser(sub)
    add_eval_parser(sub)
    add_dry_run_parser(sub)
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
    """Lines naming the verl keys that were mapped onto run settings, recorded or ignored,
    and the defaults the configuration starts from."""
    from rllib_grpo.cli.verl_keys import VERL_DEFAULTS, VERL_DEFAULTS_NOT_TAKEN, VERL_RECORDED

    lines = [f"verl key mapped: {line}" for line in exp.mapped]
    lines += [f"verl key recorded: {key}={value!r}: {VERL_RECORDED[key]}"
              for key, value in exp.recorded.items()]
    if exp.ignored:
        lines.append("verl keys ignored (no effect here, see rllib_grpo.cli.verl_keys.VERL_IGNORED): "
                     + ", ".join(exp.ignored))
    if exp.verl_defaults:
        taken = ", ".join(f"{key}={value!r}" for value, key in VERL_DEFAULTS.values())
        lines.append(f"defaults: verl's (the configuration is given in verl's keys): {taken}; "
                     "not taken: " + "; ".join(f"{key} ({why})"
                                               for key, why in VERL_DEFAULTS_NOT_TAKEN.items()))
    elif exp.algo == "GRPO":
        lines.append("defaults: rllib-grpo's (GRPOConfig(); see docs/configuration.md)")
    return lines


def run_summary(exp: Experiment, config: GRPOConfig, stop: dict[str, Any]) -> list[str]:
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
    errors = config_errors(exp)  # bad input (data files, ranges, ...) before counting prompts
    if errors:
        raise ConfigError("invalid config: " + errors[0] if len(errors) == 1 else
                          f"invalid config ({len(errors)} problems):\n" + "\n".join(errors))
    storage_error = storage_path_error(exp.storage_path)
    if storage_error:
        raise ConfigError(storage_error)
    exp.stop = resolve_stop(exp, build_config(exp))  # the run's length is part of the config
    config = build_config(exp)
    stop = exp.stop
    for line in key_report(exp) + run_summary(exp, config, stop):
        print(line, flush=True)
    return run_tune(exp, config, stop, args)


# ----------------------------------------------------------------------------- explain
def describe_run(exp: Experiment, config: GRPOConfig) -> list[str]:
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
    from rllib_grpo.cli.build import build_config, grid_points, resolve_stop
    from rllib_grpo.rllib.config.checks import find_errors, find_pitfalls

    exp = assemble_from_args(args, file, overrides)
    if exp.algo != "GRPO":
        raise ConfigError(f"explain covers GRPO configs; this experiment runs {exp.algo!r}")
    points = grid_points(exp)
    try:  # the run's length sets the LR schedule: known unless counted from the data
        exp.stop = resolve_stop(exp, build_config(exp, points[0]))
    except ConfigError:
        pass
    print("\n".join(describe_run(exp, build_config(exp, points[0]))))
    problems = False
    for point in points:
        config = with_gpu_memory(build_config(exp, point), args)
        if point:
            print(f"--- grid point {point}")
        print(config.explain())
        problems = problems or bool(find_errors(config) or find_pitfalls(config))
    return 1 if problems else 0


def dry_run(args: argparse.Namespace, file: str | None, overrides: list[str]) -> int:
    """``rllib-grpo dry-run``: place the run on a local fake-GPU cluster (`rllib_grpo.cli.dry_run`)."""
    from rllib_grpo.cli.build import build_config

    exp = assemble_from_args(args, file, overrides)
    if exp.algo != "GRPO":
        raise ConfigError(f"dry-run covers GRPO configs; this experiment runs {exp.algo!r}")
    return run_dry_run(with_gpu_memory(build_config(exp), args), args)


# ----------------------------------------------------------------------------- entry points
def main(argv: list[str] | None = None, prog: str = "rllib") -> int:
    """Parse and run one command; bad input is one line on stderr and exit code 2."""
    parser = build_parser(prog)
    args, extra = parser.parse_known_args(argv)
    if args.command in SELF_CONTAINED_COMMANDS:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        try:
            return SELF_CONTAINED_COMMANDS[args.command](args)
        except ConfigError as err:
            print(f"{prog}: error: {err}", file=sys.stderr)
            return 2
    try:
        file, overrides = split_positionals(args.args + extra, args.config_file)
        if file is not None and not Path(file).is_file():
            raise ConfigError(f"{file}: no such file")
        command = {"train": train, "explain": explain, "dry-run": dry_run}[args.command]
        if args.command == "train" and args.resume:
            command = resume
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

