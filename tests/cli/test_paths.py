"""Relative paths in configs and verl overrides resolve against the folder `rllib train`
(or `explain`) was started in, not the Tune trial's folder where the trial runs."""

from __future__ import annotations

import json

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.main import main


def test_relative_paths_resolve_against_the_launch_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    exp = assemble(overrides=[
        "data.train_files=data/train.jsonl", "data.val_files=../val.jsonl",
        "model_path=models/mine", "env_config={reward_fn: rewards/r.py:score}"])
    c = build_config(exp)
    assert c.env_config["path"] == str(tmp_path / "data" / "train.jsonl")
    assert c.val_env_config["path"] == str(tmp_path.parent / "val.jsonl")
    assert c.model_path == str(tmp_path / "models" / "mine")
    assert c.env_config["reward_fn"] == f"{tmp_path / 'rewards' / 'r.py'}:score"


def test_names_that_are_not_paths_are_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("builtin:tiny", "smollm2-135m", "Qwen/Qwen3-8B"):
        assert build_config(assemble(overrides=[f"model_path={name}"])).model_path == name
    exp = assemble(overrides=["env_config={reward_fn: 'my_pkg.rewards:score'}",
                              "data.train_files=/abs/train.jsonl"])
    assert exp.config["env_config"] == {"reward_fn": "my_pkg.rewards:score",
                                        "path": "/abs/train.jsonl"}


def test_paths_in_a_yaml_file_and_grid_searches_resolve_against_the_launch_folder(
        tmp_path, monkeypatch):
    (tmp_path / "configs").mkdir()
    yaml_file = tmp_path / "configs" / "exp.yaml"
    yaml_file.write_text("exp:\n  run: GRPO\n  config:\n    env_config:\n"
                         "      path: {grid_search: [a.jsonl, b.jsonl]}\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    exp = assemble(str(yaml_file))
    assert exp.config["env_config"]["path"] == {
        "grid_search": [str(run_dir / "a.jsonl"), str(run_dir / "b.jsonl")]}


def test_explain_finds_a_relative_data_file_from_where_it_runs(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text(
        json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "arithmetic"}) + "\n")
    monkeypatch.chdir(tmp_path)
    code = main(["explain", "--env", "rllib_grpo/GSM8K-v0", "data.train_files=data/train.jsonl",
                 "model_path=builtin:tiny"], prog="rllib-grpo")
    out = capsys.readouterr().out
    # verl's defaults (1024 prompts, rollout.n 1) may bring their own errors (exit 1); the
    # file itself is found, from the folder the command runs in.
    assert "no such file" not in out and code in (0, 1), out
    assert str(tmp_path / "data" / "train.jsonl") in out
