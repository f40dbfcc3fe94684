"""The door with images (`rllib_grpo.rllib.config.vision_plan`): what cannot run is refused
before anything starts, one line naming the fix each."""

from __future__ import annotations

import pytest

from rllib_grpo.rllib.config.checks import find_errors
from rllib_grpo.rllib.config.grpo_config import GRPOConfig


def _config(model="builtin:tiny-vlm", env="rllib_grpo/ShapeCount-v0", **training):
    settings = dict(model_path=model, sampler="hf", prompts_per_step=2, group_size=2,
                    max_prompt_length=64, max_response_length=4)
    settings.update(training)
    return GRPOConfig().environment(env, env_config={"num_problems": 8}).training(**settings)


def _vision_errors(config) -> list[str]:
    from rllib_grpo.rllib.config.vision_plan import vision_errors

    return vision_errors(config)


def test_a_vision_model_on_image_prompts_passes():
    assert _vision_errors(_config()) == []


def test_images_with_a_text_only_model_are_refused_naming_the_fix():
    (error,) = _vision_errors(_config(model="builtin:tiny"))
    assert error.startswith("env='rllib_grpo/ShapeCount-v0': the prompts carry images")
    assert "model_path='builtin:demo-vlm'" in error and "\n" not in error
    assert error in find_errors(_config(model="builtin:tiny"))


def test_freezing_a_tower_that_is_not_there_is_refused():
    config = _config(model="builtin:tiny", env="rllib_grpo/Arithmetic-v0",
                     freeze_vision_tower=True)
    assert _vision_errors(config) == [
        "freeze_vision_tower=True (verl actor.freeze_vision_tower) needs a vision-language "
        "model; model_path='builtin:tiny' has no vision tower."]


def test_vllm_without_torchvision_is_refused(monkeypatch):
    from rllib_grpo.samplers import vllm_vision

    monkeypatch.setattr(vllm_vision, "torchvision_imports", lambda: False)
    (error,) = _vision_errors(_config(sampler="vllm"))
    assert "use sampler='hf'" in error
    monkeypatch.setattr(vllm_vision, "torchvision_imports", lambda: True)
    assert _vision_errors(_config(sampler="vllm")) == []


@pytest.mark.parametrize("model, model_type", [
    ("Qwen/Qwen2.5-VL-7B-Instruct", "qwen2_5_vl"), ("Qwen/Qwen2-VL-2B-Instruct", "qwen2_vl"),
    ("builtin:demo-vlm", "qwen2_vl"), ("Qwen/Qwen3-8B", None), ("builtin:tiny", None)])
def test_vision_models_are_told_by_name_before_they_are_at_hand(model, model_type):
    from rllib_grpo.rllib.config.vision_plan import model_vision_type

    assert model_vision_type(model) == model_type
