"""verl's ``custom_reward_function.path/name/reward_kwargs`` select the reward function."""

from __future__ import annotations

import json

import pytest

from rllib_grpo.cli.build import assemble, build_config, config_errors
from rllib_grpo.cli.experiment import ConfigError

REWARD = '''
def my_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0):
    return scale * float(solution_str.strip() == str(ground_truth))
'''


def _data(tmp_path):
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "x"}) + "\n")
    return rows


@pytest.mark.parametrize("prefix", ["custom_reward_function.", "reward.custom_reward_function."])
def test_verl_custom_reward_function_sets_env_config_reward_fn(tmp_path, monkeypatch, prefix):
    (tmp_path / "my_reward.py").write_text(REWARD)
    monkeypatch.chdir(tmp_path)  # a relative path, as verl scripts give it
    exp = assemble(overrides=[f"data.train_files={_data(tmp_path)}",
                              "actor_rollout_ref.model.path=builtin:tiny",
                              f"{prefix}path=my_reward.py", f"{prefix}name=my_score",
                              f"{prefix}reward_kwargs.scale=2.0"])
    env_config = build_config(exp).env_config
    assert env_config["reward_fn"] == f"{tmp_path / 'my_reward.py'}:my_score"
    assert env_config["reward_kwargs"] == {"scale": 2.0}
    assert any("custom_reward_function" in line for line in exp.mapped)
    from rllib_grpo.rewards import RewardScorer

    scorer = RewardScorer(env_config["reward_fn"], reward_kwargs=env_config["reward_kwargs"],
                          isolation="inline")
    assert scorer("x", "2", "2")["score"] == 2.0  # scale 2.0 x an exact match


def test_verl_default_function_name_is_compute_score(tmp_path):
    reward = tmp_path / "r.py"
    reward.write_text(REWARD.replace("my_score", "compute_score"))
    exp = assemble(overrides=[f"data.train_files={_data(tmp_path)}",
                              f"custom_reward_function.path={reward}"])
    assert exp.config["env_config"]["reward_fn"] == f"{reward}:compute_score"
    assert not [e for e in config_errors(exp) if "reward_fn" in e]


def test_a_name_without_a_path_is_refused():
    with pytest.raises(ConfigError, match="need custom_reward_function.path"):
        assemble(overrides=["custom_reward_function.name=f"])
