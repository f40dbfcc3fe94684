"""`rllib train`: flags, experiment YAML files and verl's command line.

Argument parsing and key validation run in-process (fast); three real one-iteration
trainings run as concurrent subprocesses (each starts its own Ray on 2 CPUs): one from
flags, one from a YAML file with verl-style overrides and completions in TensorBoard, one
with verl's reward model on a reward worker.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rllib_grpo.cli.algorithms import known_algorithms, resolve_algo
from rllib_grpo.cli.build import (
    assemble,
    build_config,
    config_errors,
    grid_points,
    resolve_stop,
)
from rllib_grpo.cli.experiment import ConfigError, parse_scalar
from rllib_grpo.cli.main import build_parser, check_resources, main, split_positionals
from rllib_grpo.cli.verl_keys import (
    VERL_IGNORED,
    VERL_IGNORED_AT,
    VERL_MUST_MATCH,
    VERL_RECORDED,
    VERL_REFUSED_LAYOUTS,
    VERL_TO_RUN,
    VERL_TO_SUB_KEY,
)
from rllib_grpo.rllib.config.settings import VERL_ALIASES
from tests.helpers.cli_runs import ENV, RAY_LIMITS, TINY, TINY_VERL, read_text_summaries


def _yaml(tmp_path: Path, text: str, name: str = "exp.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# ----------------------------------------------------------------------------- in-process
@pytest.mark.parametrize("text, value", [
    ("True", True), ("1e-6", 1e-6), ("5", 5), ("grpo", "grpo"), ("[console,wandb]",
     ["console", "wandb"]), ("null", None), ("0.28", 0.28), ("-1", -1),
])
def test_values_are_yaml_scalars(text, value):
    assert parse_scalar(text) == value


def test_verl_overrides_set_the_same_config_as_our_names():
    ours = build_config(assemble(config_json=json.dumps(TINY), env=ENV))
    verl = build_config(assemble(overrides=[*TINY_VERL, "env_config={max_operand: 4}"], env=ENV))
    for field in ("model_path", "sampler", "prompts_per_step", "group_size",
                  "max_prompt_length", "max_response_length", "env_config"):
        assert getattr(verl, field) == getattr(ours, field), field


def test_yaml_file_in_the_classic_shape(tmp_path):
    path = _yaml(tmp_path, f"""
my_exp:
  run: GRPO
  env: {ENV}
  stop: {{training_iteration: 3}}
  checkpoint_config: {{checkpoint_frequency: 2}}
  config:
    lr: 1e-6                      # YAML 1.1 would read this as a string
    actor_rollout_ref:            # a nested verl section
      rollout: {{n: 6}}
      actor: {{kl_loss_coef: 0.01}}
""")
    exp = assemble(path, ["prompts_per_step=8"], stop_json='{"training_iteration": 5}')
    config = build_config(exp)
    assert (exp.name, exp.algo, exp.env, exp.checkpoint_freq) == ("my_exp", "GRPO", ENV, 2)
    assert exp.stop == {"training_iteration": 5}  # --stop wins over the file
    assert config.lr == 1e-6 and config.group_size == 6 and config.kl_loss_coef == 0.01
    assert config.prompts_per_step == 8


def test_later_sources_win_but_one_source_may_not_contradict_itself(tmp_path):
    path = _yaml(tmp_path, "exp:\n  config: {group_size: 4}\n")
    assert assemble(path, ["actor_rollout_ref.rollout.n=8"]).config["group_size"] == 8
    with pytest.raises(ConfigError, match="'actor_rollout_ref.rollout.n' and 'group_size'"):
        assemble(overrides=["group_size=4", "actor_rollout_ref.rollout.n=8"])


def test_verl_file_keys_merge_into_env_config(tmp_path):
    path = _yaml(tmp_path, "exp:\n  config:\n    env_config: {max_operand: 4}\n"
                           "    data.train_files: a.jsonl\n")
    # (relative paths resolve against the launch folder, see tests/cli/test_paths.py)
    assert assemble(path).config["env_config"] == {"max_operand": 4,
                                                   "path": str(Path.cwd() / "a.jsonl")}
    with pytest.raises(ConfigError, match="sets env_config.path='b.jsonl' but it is already"):
        assemble(overrides=["env_config={path: a.jsonl}", "data.train_files=b.jsonl"])


def test_verl_trainer_keys_set_how_the_experiment_runs():
    exp = assemble(overrides=["trainer.total_training_steps=7", "trainer.save_freq=3",
                              "trainer.experiment_name=run1", "trainer.n_gpus_per_node=4",
                              "trainer.nnodes=2", "trainer.logger=[console,wandb]",
                              "actor_rollout_ref.rollout.enforce_eager=True"])
    assert exp.stop == {"training_iteration": 7}
    assert (exp.checkpoint_freq, exp.name) == (3, "run1")
    # verl's colocated layout: a learner per GPU, an engine (TP 1) on each learner's GPU.
    assert (exp.config["num_learners"], exp.config["num_env_runners"]) == (8, 8)
    assert exp.config["num_gpus_per_learner"] + exp.config["num_gpus_per_env_runner"] == 1
    assert exp.config["sampler_config"] == {"enforce_eager": True}
    assert exp.config["loggers"] == ("console", "wandb") and exp.ignored == []


def test_total_epochs_counts_the_prompts_like_verl():
    exp = assemble(overrides=["trainer.total_epochs=2", "data.train_batch_size=16",
                              "env_config={num_problems: 100}"], env=ENV)
    assert resolve_stop(exp, build_config(exp)) == {"training_iteration": 2 * (100 // 16)}
    missing = assemble(overrides=["trainer.total_epochs=2", "data.train_files=/no/such.jsonl"],
                       env="rllib_grpo/GSM8K-v0")
    with pytest.raises(ConfigError, match="trainer.total_epochs: cannot count the prompts"):
        resolve_stop(missing, build_config(missing))


def test_verl_tables_are_explained_and_disjoint():
    tables = [VERL_IGNORED, VERL_IGNORED_AT, VERL_TO_RUN, VERL_TO_SUB_KEY, VERL_RECORDED,
              VERL_REFUSED_LAYOUTS, VERL_MUST_MATCH]
    keys = [k for table in tables for k in table]
    assert len(keys) == len(set(keys))
    assert not set(keys) & set(VERL_ALIASES), "a verl key with a real mapping belongs there"
    assert all(reason for reason in VERL_IGNORED.values())


def test_grid_search_is_checked_point_by_point():
    exp = assemble(config_json=json.dumps({**TINY, "group_size": {"grid_search": [2, 4]}}))
    assert grid_points(exp) == [{"group_size": 2}, {"group_size": 4}]
    assert config_errors(exp) == []
    bad = assemble(config_json=json.dumps({**TINY, "group_size": {"grid_search": [1, 4]}}))
    assert "at {'group_size': 1}" in config_errors(bad)[0]
    verl = assemble(overrides=["actor_rollout_ref.rollout.n={grid_search: [2, 4]}"])
    assert grid_points(verl) == [{"group_size": 2}, {"group_size": 4}]


def test_builtin_algorithms_resolve_by_name():
    from ray.rllib.algorithms.ppo import PPO, PPOConfig

    assert resolve_algo("PPO") is PPO and "PPO" in known_algorithms()
    exp = assemble(algo="PPO", env="CartPole-v1", config_json='{"lr": 1e-4, "num_workers": 0}',
                   overrides=["train_batch_size_per_learner=500",
                              "model_config={fcnet_hiddens: [32]}"])
    config = build_config(exp)
    assert isinstance(config, PPOConfig) and config.lr == 1e-4 and config.env == "CartPole-v1"
    assert config.num_env_runners == 0 and config.train_batch_size_per_learner == 500
    assert config.model_config["fcnet_hiddens"] == [32]
    assert resolve_algo("GRPO").__name__ == "GRPO"


def test_a_trial_larger_than_the_local_ray_is_refused_before_tune_waits_forever():
    from ray.rllib.algorithms.ppo import PPO

    config = build_config(assemble(algo="PPO", env="CartPole-v1"))  # 1 + 2 env runners
    with pytest.raises(ConfigError, match=r"one trial cannot be placed on this Ray \(1 node\(s\): "
                                          r"2 CPU\): bundle \d needs 1 CPU on one node"):
        check_resources(PPO, config, [{"CPU": 2.0}])
    check_resources(PPO, config, [{"CPU": 4.0}])


def test_a_grpo_trial_with_a_reward_worker_that_does_not_fit_names_the_worker():
    """`rllib train ... reward_model.enable=True` on one CPU: the reward worker needs a CPU
    of its own in the trial (it waited forever before); named before Tune starts."""
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    config = build_config(assemble(overrides=[
        "reward_model.enable=True", "reward_model.model.path=builtin:tiny-rm",
        "model_path=builtin:tiny"]))
    check_resources(GRPO, config, [{"CPU": 2.0}])  # main process + reward worker
    with pytest.raises(ConfigError, match=r"reward worker builtin_tiny-rm\[0\] needs 1 CPU"):
        check_resources(GRPO, config, [{"CPU": 1.0}])
    with pytest.raises(ConfigError, match=r"reward worker builtin_tiny-rm\[0\] needs 1 CPU, 1 GPU"):
        config = build_config(assemble(overrides=[
            "reward_model.enable=True", "reward_model.model.path=builtin:tiny-rm",
            "model_path=builtin:tiny", "num_gpus_per_reward_worker=1"]))
        check_resources(GRPO, config, [{"CPU": 4.0, "GPU": 0.0}, {"CPU": 4.0}])


def test_positionals_split_into_file_and_overrides():
    assert split_positionals(["file", "x.yaml", "a=1"], None) == ("x.yaml", ["a=1"])
    assert split_positionals(["x.yml", "a.b=c"], None) == ("x.yml", ["a.b=c"])
    assert split_positionals(["a=1"], "y.yaml") == ("y.yaml", ["a=1"])


def test_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        build_parser("rllib").parse_args(["train", "--help"])
    text = capsys.readouterr().out
    for option in ("--algo", "--env", "--config", "--stop", "--checkpoint-freq",
                   "--storage-path", "--num-samples", "--ray-address", "--num-cpus",
                   "--object-store-memory", "--name", "file", "KEY=VALUE", "exit codes"):
        assert option in text, option


def _assert_one_error_line(err: str, needle: str) -> None:
    errors = [line for line in err.splitlines() if line.startswith("rllib: error:")]
    assert len(errors) == 1 and needle in errors[0], err


@pytest.mark.parametrize("argv, needle", [
    (["--config", "{bad"], "--config: invalid JSON"),
    (["--stop", "[1]"], "--stop: expected a JSON object"),
    (["--stop", '{"training_iteration": "x"}'], "stop 'training_iteration'"),
    (["not_a_key=1"], "unknown config key 'not_a_key'"),
    (["algorithm.filter_groups.nope=1"], "verl key 'algorithm.filter_groups.nope' has no "
                                         "rllib-grpo equivalent yet"),
    (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"],
     "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 is refused: Ulysses"),
    (["actor_rollout_ref.rollout.n=abc"], "actor_rollout_ref.rollout.n='abc': expected int"),
    (["train_batch_size=4"], "'train_batch_size' is derived for GRPO"),
    (["--algo", "PPO", "actor_rollout_ref.rollout.n=3"], "only applies to --algo GRPO"),
    (["--algo", "NOPE"], "--algo 'NOPE': unknown algorithm"),
    (["group_size=1"], "group_size=1"),
    (["oops"], "unexpected argument 'oops'"),
    (["file", "/no/such.yaml"], "/no/such.yaml: no such file"),
    (["--ray-address", "auto", "--num-cpus", "2"], "--num-cpus sizes a Ray started here"),
])
def test_bad_input_is_one_line_and_exit_code_2(argv, needle, capsys):
    assert main(["train", *argv]) == 2
    _assert_one_error_line(capsys.readouterr().err, needle)


@pytest.mark.timeout(120)
def test_contradicting_ray_flags_are_refused_while_ray_is_up(ray_session, capsys):
    # Once refused only when Ray was down: with Ray up (a notebook, the test session)
    # the run started with a default config and no stop, and never ended.
    argv = ["--ray-address", "auto", "--num-cpus", "2"]
    assert main(["train", *argv]) == 2
    _assert_one_error_line(capsys.readouterr().err, "--num-cpus sizes a Ray started here")


@pytest.mark.parametrize("text, needle", [
    ("exp:\n  config: {lr: [1, 2\n", "invalid YAML"),
    ("exp:\n  run: GRPO\n  stopp: {}\n", "unknown experiment key 'stopp'"),
    ("exp:\n  config: {nosuch: 1}\n", "unknown config key 'nosuch'"),
    ("exp:\n  config:\n    actor_rollout_ref.rollout.multi_turn.tool_config_path: t.yaml\n",
     "has no rllib-grpo equivalent yet"),
    ("- a\n- b\n", "expected a mapping"),
])
def test_bad_yaml_files_exit_2_naming_the_problem(tmp_path, text, needle, capsys):
    assert main(["train", "file", _yaml(tmp_path, text)]) == 2
    _assert_one_error_line(capsys.readouterr().err, needle)


# ----------------------------------------------------------------------------- subprocesses
def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "rllib_grpo.cli.main", "train", *args, *RAY_LIMITS]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def trainings(tmp_path_factory):
    """Two one-iteration runs at once: from flags, and from YAML + verl overrides."""
    root = tmp_path_factory.mktemp("cli")
    tiny_yaml = root / "tiny.yaml"
    tiny_yaml.write_text(f"tiny:\n  run: GRPO\n  env: {ENV}\n  config:\n"
                         "    env_config: {max_operand: 4}\n    log_completions_every: 1\n"
                         "    model_path: builtin:demo\n    group_size: 2\n")
    flags = _start(["--algo", "GRPO", "--env", ENV, "--config", json.dumps(TINY),
                    "--stop", '{"training_iteration": 1}', "--checkpoint-freq", "1",
                    "--storage-path", str(root / "flags")], root)
    verl = _start(["file", str(tiny_yaml), *TINY_VERL, "trainer.total_training_steps=1",
                   "trainer.experiment_name=verl_run", "trainer.logger=[console]",
                   "actor_rollout_ref.model.use_remove_padding=True",
                   "--storage-path", str(root / "verl")], root)
    # The reward model on an actor of its own, on a 2-CPU Ray (it waited forever once: the
    # trial's resource request left it no CPU).
    reward_model = _start([*TINY_VERL, "--env", ENV, "trainer.total_training_steps=1",
                           "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                           "reward_model.enable=True", "reward_model.model.path=builtin:tiny-rm",
                           "trainer.val_before_train=False", "--storage-path",
                           str(root / "reward_model")], root)
    runs = (("flags", flags), ("verl", verl), ("reward_model", reward_model))
    outputs = {name: proc.communicate(timeout=360)[0] for name, proc in runs}
    return root, outputs, {name: proc.returncode for name, proc in runs}


def _checkpoint(output: str) -> Path:
    match = re.search(r"^checkpoint: (.+)$", output, re.MULTILINE)
    assert match, output[-3000:]
    path = Path(match.group(1))
    assert path.is_dir() and (path / "rllib_checkpoint.json").is_file()
    return path


@pytest.mark.ray  # `trainings`: rllib train runs, each on its own Ray
def test_train_from_flags_writes_a_checkpoint(trainings):
    root, outputs, codes = trainings
    assert codes["flags"] == 0, outputs["flags"][-3000:]
    checkpoint = _checkpoint(outputs["flags"])
    assert checkpoint.is_relative_to(root / "flags")
    assert re.search(r"^iter 1  reward ", outputs["flags"], re.MULTILINE)
    assert "TensorBoard: tensorboard --logdir" in outputs["flags"]
    # The quiet console: the start-up time, and no banners from Ray, RLlib or Tune.
    assert re.search(r"^start-up: \d", outputs["flags"], re.MULTILINE), outputs["flags"]
    for banner in ("Token authentication", "new API stack", "Install gputil",
                   "RLModuleConfig", "View detailed results here", "Configuration for experiment"):
        assert banner not in outputs["flags"], banner
    assert list(checkpoint.parent.glob("events.out.tfevents.*"))


@pytest.mark.ray  # `trainings`: rllib train runs, each on its own Ray
def test_train_from_yaml_with_verl_overrides(trainings):
    root, outputs, codes = trainings
    out = outputs["verl"]
    assert codes["verl"] == 0, out[-3000:]
    checkpoint = _checkpoint(out)
    trial = checkpoint.parent
    assert trial.parent == root / "verl" / "verl_run"  # trainer.experiment_name
    params = json.loads((trial / "params.json").read_text())
    assert params["loggers"] == ["console"]  # trainer.logger is a setting, no longer ignored
    assert (params["group_size"], params["prompts_per_step"], params["model_path"]) == (
        4, 4, "builtin:tiny")  # the overrides won over the file
    assert len((trial / "result.json").read_text().splitlines()) == 1  # one iteration
    texts = read_text_summaries(trial)
    assert any(tag.startswith("completions") for tag in texts), texts


@pytest.mark.ray  # `trainings`: rllib train runs, each on its own Ray
def test_train_with_a_reward_model_on_two_cpus_runs(trainings):
    """verl's `reward_model.enable=True` on a 2-CPU Ray: the trial reserves the reward
    worker's CPU beside the main process, and the iteration runs."""
    root, outputs, codes = trainings
    out = outputs["reward_model"]
    assert codes["reward_model"] == 0, out[-3000:]
    assert re.search(r"^iter 1  reward ", out, re.MULTILINE), out[-3000:]
    _checkpoint(out)


RAY_ADDRESS_CHECK = """
import argparse, os, sys
sys.path.insert(0, ".")
import ray
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={
    "num_cpus": 1, "resources": {"joined_marker": 1}, "include_dashboard": False})
os.environ["RAY_ADDRESS"] = cluster.address
from rllib_grpo.cli.run import _init_ray
args = argparse.Namespace(ray_address=None, num_cpus=None, num_gpus=None,
                          object_store_memory=None, verbose=0)
try:
    print("started", _init_ray(args), "marker", ray.cluster_resources().get("joined_marker"))
    ray.shutdown()
    args.num_cpus = 2
    try:
        _init_ray(args)
    except Exception as error:
        print("refused", type(error).__name__, error)
finally:
    ray.shutdown()
    cluster.shutdown()
"""


@pytest.mark.ray  # starts a Ray cluster and rllib train
def test_rllib_train_joins_the_cluster_in_ray_address():
    """`ray job submit -- rllib train ...` sets RAY_ADDRESS for its entrypoint: the run joins
    that cluster (its custom resource is seen) instead of starting a new local Ray, and a
    flag that sizes a local Ray is refused beside it."""
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT

    proc = subprocess.run([sys.executable, "-c", RAY_ADDRESS_CHECK], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any(line.startswith("joining the Ray cluster at ") and line.endswith("(RAY_ADDRESS)")
               for line in lines), lines
    assert "started True marker 1.0" in lines
    assert any(line.startswith("refused ConfigError --num-cpus sizes a Ray started here; it "
                               "cannot be used with RAY_ADDRESS=") for line in lines), lines
