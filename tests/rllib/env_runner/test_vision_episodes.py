"""Multi-turn episodes on prompts with images (`rllib_grpo.rllib.env_runner.episode_sampler`):
every turn's request carries its episode's images, and every row of the batch its prompt's
vision inputs."""

from __future__ import annotations

import numpy as np
from PIL import Image

from rllib_grpo.data.images import VisionInputs
from rllib_grpo.data.trajectory import EpisodeLimits
from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.rllib.env_runner.episode_sampler import EpisodeSampler
from rllib_grpo.samplers import SamplingParams
from tests.helpers.scripted_agents import TOKENIZER, ScriptedSampler, calculator_agent


class ImageRecordingSampler(ScriptedSampler):
    """The scripted agent, recording the images each call was given per request."""

    def __init__(self, script):
        super().__init__(script)
        self.images: list[list] = []

    def generate(self, prompts, n, params, *, seeds=None, images=None):
        self.images.append(list(images) if images is not None else None)
        return super().generate(prompts, n, params, seeds=seeds)


def test_every_turn_and_every_row_keeps_its_prompts_images():
    env = ToolArithmeticEnv(num_problems=10, seed=0, tokenizer=TOKENIZER)
    prompts = []
    for shade in (10, 200):
        obs, info = env.reset()
        picture = (Image.new("RGB", (28, 28), (shade, 0, 0)),)
        vision = VisionInputs(np.full((4, 3), shade, np.float32), np.array([[1, 2, 2]]))
        prompts.append({"text": obs, **info, "images": picture, "multi_modal_inputs": vision})
    sampler = ImageRecordingSampler(calculator_agent)
    runner = EpisodeSampler(env, sampler, TOKENIZER, EpisodeLimits(64), seed=7)
    episodes = runner.sample(prompts, [0, 1], 3, SamplingParams(max_tokens=64))
    batch = runner.to_batch(episodes, pad_token_id=0)
    first, second = sampler.images  # the tool call's turn, then the answer's
    assert first == [prompts[0]["images"], prompts[1]["images"]]
    assert second == [prompts[0]["images"]] * 3 + [prompts[1]["images"]] * 3
    assert [v is prompts[row // 3]["multi_modal_inputs"]
            for row, v in enumerate(batch.multi_modal_inputs)] == [True] * 6
    assert batch.select([5, 0]).multi_modal_inputs.tolist() == [
        prompts[1]["multi_modal_inputs"], prompts[0]["multi_modal_inputs"]]
