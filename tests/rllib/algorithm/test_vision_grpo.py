"""GRPO steps on image prompts with the tiny VLM (transformers sampler, local runner and
learner): the rollout batch carries each row's vision inputs, the weight sync carries the
vision tower when it trains, and ``freeze_vision_tower`` trains the language model alone.
The learning curve is tests/rllib/algorithm/test_vision_learning.py (slow)."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.models.vision_forward import vision_tower


def _config(**training):
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    # The warmed-up model: about half its answers right, so groups carry a gradient (the
    # random tiny VLM's rewards are all 0, and weight decay alone would move the weights).
    settings = dict(model_path="builtin:demo-vlm", sampler="hf", prompts_per_step=4,
                    group_size=4, max_prompt_length=64, max_response_length=4, lr=1e-2,
                    weight_decay=0.0)
    settings.update(training)
    return (GRPOConfig().environment("rllib_grpo/ShapeCount-v0", env_config={"num_problems": 16})
            .training(**settings).debugging(seed=0))


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("freeze", [False, True], ids=["tower-trains", "tower-frozen"])
def test_a_step_trains_and_syncs_the_vision_tower_unless_frozen(ray_session, freeze):
    algo = _config(freeze_vision_tower=freeze).build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner
        lm = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped().lm
        before = _weights(lm)
        batch = runner.sample(num_prompts=2)
        assert len(batch.multi_modal_inputs) == 8
        assert batch.multi_modal_inputs[0] is batch.multi_modal_inputs[3]  # one per group
        result = algo.train()
        assert result["groups/zero_variance_frac"] < 1  # a gradient to follow
        after = _weights(lm)
        tower = {f"model.visual.{k}" for k in vision_tower(lm).state_dict()}
        moved = {k for k in after if not torch.equal(before[k], after[k])}
        assert moved - tower  # the language model trained
        assert (moved & tower == set()) if freeze else (tower <= moved)
        sampler = runner.sampler.model.state_dict()
        for key in tower | {"lm_head.weight"}:  # the sampler holds the learner's weights
            assert torch.equal(sampler[key], after[key]), key
    finally:
        algo.stop()
