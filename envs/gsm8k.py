"""GSM8K env: grade-school word problems, answer after ``####`` (scorer: ``gsm8k``)."""

from __future__ import annotations

from rllib_grpo.envs._file_env import FilePromptEnv


class GSM8KEnv(FilePromptEnv):
    """GSM8K prompts from ``path`` (e.g. made by ``python -m rllib_grpo.envs.prepare_data
    gsm8k``), or the shipped fixture. Pass ``reward_kwargs={"method": "flexible"}``
    to accept a last-number answer without ``####``."""

    FIXTURE = "gsm8k_fixture.jsonl"
    DATA_SOURCE = "openai/gsm8k"
