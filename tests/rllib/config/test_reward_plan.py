"""The reward plan of a config: TRL's and verl's ways of naming a reward model, explain's
reward lines, and bad reward inputs refused before Ray starts (exit 2, one line)."""

from __future__ import annotations

import json
import socket

import pytest

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.main import main
from rllib_grpo.rllib.config.grpo_config import GRPOConfig
from rllib_grpo.rllib.config.reward_plan import reward_plan_errors, reward_specs


@pytest.fixture(scope="module")
def rm_folder():
    from rllib_grpo.models.model_registry import resolve_model

    return resolve_model("builtin:tiny-rm")


@pytest.mark.parametrize("keys", [
    ["reward_model.enable=True", "reward_model.model.path={rm}",
     "reward_model.micro_batch_size_per_gpu=8"],
    ["reward.reward_model.enable=True", "reward.reward_model.model_path={rm}",
     "reward.reward_model.micro_batch_size_per_gpu=8"],
])
def test_verl_reward_model_keys_map(keys, rm_folder):
    exp = assemble(overrides=[k.format(rm=rm_folder) for k in keys]
                   + ["actor_rollout_ref.model.path=builtin:tiny"])
    config = build_config(exp)
    assert config.reward_model_enable and config.reward_model_path == rm_folder
    assert config.reward_batch_size == 8
    (spec,) = reward_specs(config)
    assert (spec.kind, spec.source, spec.weight) == ("model", rm_folder, 1.0)
    assert reward_plan_errors(config) == []


def test_trl_reward_funcs_with_a_string_as_a_model(rm_folder):
    config = GRPOConfig().training(reward_funcs=["arithmetic", rm_folder],
                                   reward_weights=[1.0, 0.1])
    specs = reward_specs(config)
    assert [(s.kind, s.weight) for s in specs] == [("function", 1.0), ("model", 0.1)]
    assert reward_plan_errors(config) == []
    text = config.explain()
    assert "score = weighted sum of 2" in text
    assert "tiny-rm" in text and "1 Ray actor(s) x 0 GPU (float32, 64 samples per forward)" in text
    assert "MiB of weights on disk per actor" in text


def test_no_reward_funcs_is_the_env_reward_alone():
    config = GRPOConfig()
    assert reward_specs(config) is None
    assert "the env's own reward" in config.explain()


def _closed_port_url():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/reward"


@pytest.mark.parametrize("funcs, needle", [
    (["/no/such/rm"], "no such folder"),
    (["builtin:tiny"], "not a sequence-classification model"),
    ([{"type": "judge", "model": "builtin:tiny", "template": "grade {response}"}],
     "lacks {prompt}"),
    ([{"type": "judge", "model": "builtin:tiny", "parse": "stars"}], "parse rule 'stars'"),
    ([None, _closed_port_url()], "is unreachable"),
    ([None, None, None], "3 reward_funcs"),
])
def test_bad_reward_inputs_exit_2_with_one_line(funcs, needle, capsys):
    weights = [1.0, 1.0] if len(funcs) == 3 else None
    from rllib_grpo.models.model_registry import resolve_model

    resolve_model("builtin:tiny")  # built: the door checks its config.json
    config = {"reward_funcs": funcs, "reward_weights": weights}
    argv = ["--config", json.dumps(config), "model_path=builtin:tiny"]
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert len([line for line in err.splitlines() if line.startswith("rllib: error:")]) == 1
    assert needle in err
    # explain lists it under ERRORS (exit 1: problems found), on one line.
    assert main(["explain", *argv]) == 1
    out = capsys.readouterr().out
    assert len([line for line in out.splitlines() if needle in line]) == 1, out


def test_enable_without_a_path_and_enable_with_reward_funcs_are_refused():
    assert "needs reward_model_path" in reward_plan_errors(
        GRPOConfig().training(reward_model_enable=True))[0]
    assert "give one of them" in reward_plan_errors(GRPOConfig().training(
        reward_model_enable=True, reward_model_path="x", reward_funcs=["env"]))[0]
