"""`rllib-grpo explain`: every shipped config explains cleanly; verl command lines with a
mistake exit 1 and name it; bad input exits 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.main import main
from tests.conftest import REPO_ROOT

CONFIGS = sorted((REPO_ROOT / "configs").glob("*.yaml"))
BIN = Path(sys.executable).parent


@pytest.fixture(autouse=True)
def no_model_builds(monkeypatch):
    """explain's memory plan reads the model's shape, which builds a built-in model (tens of
    seconds for smollm2-135m on a fresh cache); the plans and pitfalls tested here do not
    depend on it, so it reports "unavailable" instead (tests/rllib/config/test_memory_plan.py
    tests the plan)."""
    from rllib_grpo.rllib.config import learner_memory

    def unavailable(*args, **kwargs):
        raise RuntimeError("model shape not read in these tests")

    monkeypatch.setattr(learner_memory, "config_shape", unavailable)


def _explain(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(["explain", *argv], prog="rllib-grpo")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_expected_configs_ship():
    names = {p.name for p in CONFIGS}
    assert {"verl_qwen3_8b_grpo.yaml", "dr_grpo.yaml", "dapo_style.yaml", "cpu_demo.yaml",
            "smollm2_arithmetic_cpu.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_each_config_explains_without_pitfalls(path, capsys, tmp_path, monkeypatch):
    # The data files the configs name must exist (relative paths: from where it runs).
    from rllib_grpo.envs._file_env import fixture_path

    monkeypatch.chdir(tmp_path)
    # verl's configs log to wandb, as verl's do: refused when wandb is missing (tested in
    # tests/cli/test_loggers.py); here it counts as installed.
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object()
                        if name in ("wandb", "mlflow") else real_find_spec(name, *a))
    (tmp_path / "data" / "gsm8k").mkdir(parents=True)
    (tmp_path / "data" / "gsm8k" / "train.jsonl").write_bytes(
        fixture_path("gsm8k_fixture.jsonl").read_bytes())
    code, out, err = _explain([str(path)], capsys)
    assert code == 0, out + err
    assert "No pitfalls found." in out and "trajectories per step:" in out


def test_verl_qwen3_8b_config_matches_verls_script():
    exp = assemble(str(next(p for p in CONFIGS if p.stem == "verl_qwen3_8b_grpo")))
    c = build_config(exp)
    assert (c.adv_estimator, c.use_kl_in_reward, c.group_size, c.prompts_per_step) == (
        "grpo", False, 5, 1024)
    assert (c.prompts_per_minibatch, c.use_kl_loss, c.kl_loss_type, c.kl_loss_coef) == (
        256, True, "low_var_kl", 0.001)
    assert (c.lr, c.max_prompt_length, c.max_response_length, c.entropy_coeff) == (
        1e-6, 1024, 2048, 0)
    assert (c.use_dynamic_bsz, c.max_tokens_per_micro_batch, c.model_path) == (
        True, 24576, "Qwen/Qwen3-8B")
    assert c.env == "rllib_grpo/GSM8K-v0" and "path" in c.env_config
    assert (c.num_learners, exp.checkpoint_freq, exp.total_epochs) == (8, 20, 15)
    assert (c.master_weights_dtype, c.model_dtype, c.sampler_dtype) == (
        "float32", "bfloat16", "bfloat16")


def test_verl_command_line_with_an_error_exits_1(capsys):
    code, out, _ = _explain(["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=1",
                             "data.train_batch_size=8"], capsys)
    assert code == 1
    assert "ERRORS:" in out and "group_size=1 with adv_estimator='grpo'" in out


def test_verl_command_line_with_a_pitfall_exits_1(capsys):
    code, out, _ = _explain(["algorithm.norm_adv_by_std_in_grpo=False",
                             "actor_rollout_ref.rollout.n=4"], capsys)
    assert code == 1
    assert "PITFALLS:" in out and "Dr.GRPO half-applied" in out


def test_overrides_apply_on_top_of_a_config_file(capsys):
    dr = str(next(p for p in CONFIGS if p.stem == "dr_grpo"))
    code, out, _ = _explain([dr, "actor_rollout_ref.actor.loss_agg_mode=token-mean"], capsys)
    assert code == 1 and "Dr.GRPO half-applied" in out


def test_grid_points_are_explained_one_by_one(capsys):
    code, out, _ = _explain(["--config", '{"group_size": {"grid_search": [4, 8]}}'], capsys)
    assert code == 0 and out.count("--- grid point") == 2


@pytest.mark.parametrize("argv, needle", [
    (["actor_rollout_ref.rollout.multi_turn.tool_config_path=t.yaml"], "no rllib-grpo equivalent"),
    (["bogus=1"], "unknown config key 'bogus'"),
    (["--config", "[1"], "--config: invalid JSON"),
])
def test_bad_input_exits_2(argv, needle, capsys):
    code, _, err = _explain(argv, capsys)
    assert code == 2 and needle in err


@pytest.mark.processes
def test_console_scripts_run():
    """The installed `rllib-grpo` and `rllib` scripts (one subprocess each)."""
    dr = str(next(p for p in CONFIGS if p.stem == "dr_grpo"))
    explain = subprocess.run([str(BIN / "rllib-grpo"), "explain", dr], capture_output=True,
                             text=True, timeout=120)
    assert explain.returncode == 0, explain.stderr[-2000:]
    assert "advantage:                     grpo (Dr.GRPO" in explain.stdout
    helped = subprocess.run([str(BIN / "rllib"), "train", "--help"], capture_output=True,
                            text=True, timeout=60)
    assert helped.returncode == 0 and "--checkpoint-freq" in helped.stdout
