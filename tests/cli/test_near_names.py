"""A misspelt key, ours or verl's, is answered with the nearest known names (difflib)."""

from __future__ import annotations

import pytest

from rllib_grpo.cli.main import main
from tests.conftest import tiny_config


@pytest.mark.parametrize("typo, nearest", [
    ("group_sise", "group_size"),
    ("actor_rollout_ref.rollout.nn", "actor_rollout_ref.rollout.n"),
    ("actor_rollout_ref.actor.ppo_mini_batchsize", "actor_rollout_ref.actor.ppo_mini_batch_size"),
    ("data.train_batchsize", "data.train_batch_size"),
    ("algorithm.adv_estimater", "algorithm.adv_estimator"),
])
def test_a_typo_on_the_command_line_names_the_nearest_key(typo, nearest, capsys):
    assert main(["explain", f"{typo}=4"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"Did you mean '{nearest}'" in err, err


def test_a_typo_in_python_names_the_nearest_setting():
    with pytest.raises(TypeError, match="unknown setting 'group_sise'. Did you mean 'group_size'"):
        tiny_config().training(group_sise=4)
    with pytest.raises(TypeError, match="Did you mean 'grad_clip'"):
        tiny_config().training(grad_clp=1.0)
