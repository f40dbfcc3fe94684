"""GRPO with a reward model on its own Ray actor: per-name metrics, the weighted score, and
a killed reward actor that the next step survives."""

from __future__ import annotations

import pytest

from tests.conftest import EPS32, tiny_config

RM = "builtin:tiny-rm"
RM_NAME = "builtin_tiny-rm"


@pytest.mark.slow  # ~40 s: Ray, a reward actor, two steps
@pytest.mark.timeout(300)
def test_a_step_scores_with_the_reward_model_and_survives_its_actor_being_killed(ray_session):
    from rllib_grpo.models.model_registry import resolve_model
    from rllib_grpo.rewards.reward_model import SequenceClassifierReward

    config = tiny_config(reward_funcs=["env", RM], reward_weights=[1.0, 0.5])
    algo = config.build_algo()
    try:
        actors = algo._reward_actors.actors[RM_NAME]
        assert len(actors) == 1
        result = algo.train()
        runners = result["env_runners"]
        assert f"reward/{RM_NAME}/mean" in runners and "reward/env/mean" in runners
        assert f"timing_s/reward/{RM_NAME}" in runners
        rollout = algo.last_rollout
        # score = 1 x the rule reward + 0.5 x the model's score, per sample; and the model
        # scores (prompt, response) as the same model in process does.
        infos = rollout.infos
        local = SequenceClassifierReward(resolve_model(RM))
        model_scores = local.score([i["prompt"] for i in infos], [i["response"] for i in infos])
        for info, expected in zip(infos, model_scores, strict=True):
            parts = info["reward_components"]
            # The same float32 model on the same batch in another process, whose thread
            # count may split the reductions (<= 24 positions x 64 units) otherwise.
            assert parts[RM_NAME] == pytest.approx(
                expected, abs=24 * 64 * EPS32 * max(1.0, abs(expected)))
            assert info["score"] == pytest.approx(parts["env"] + 0.5 * parts[RM_NAME], abs=1e-12)
        assert ray_session.get(actors[0].stats.remote())["num_batches"] == 1  # one call

        ray_session.kill(actors[0], no_restart=False)  # the reward actor dies ...
        result = algo.train()  # ... and the step completes on its restarted copy
        assert f"reward/{RM_NAME}/mean" in result["env_runners"]
        assert not any(info["reward_error"] for info in algo.last_rollout.infos)
    finally:
        algo.stop()
