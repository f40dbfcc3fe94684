"""MATH env: competition problems, answer in ``\\boxed{}`` (scorer: ``math``)."""

from __future__ import annotations

from rllib_grpo.envs._file_env import FilePromptEnv


class MATHEnv(FilePromptEnv):
    """MATH prompts from ``path`` (e.g. made by ``python -m rllib_grpo.envs.prepare_data
    math``), or the shipped fixture."""

    FIXTURE = "math_fixture.jsonl"
    DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
