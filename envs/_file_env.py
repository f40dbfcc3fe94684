"""Base for envs over a prompt file, defaulting to a fixture shipped in ``envs/data``."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from rllib_grpo.data.datasets import load_prompts
from rllib_grpo.data.env import TextEnv


def fixture_path(file_name: str) -> Path:
    """Path of a fixture file shipped in ``rllib_grpo/envs/data``."""
    return Path(str(resources.files("rllib_grpo.envs") / "data" / file_name))


class FilePromptEnv(TextEnv):
    """A :class:`~rllib_grpo.data.env.TextEnv` over ``path`` (verl or plain rows).

    Rows without a ``data_source`` get :attr:`DATA_SOURCE`. With ``path=None`` the
    shipped :attr:`FIXTURE` is used (a few dozen rows, for smoke tests and demos).
    """

    FIXTURE: ClassVar[str]
    DATA_SOURCE: ClassVar[str]

    def __init__(
        self,
        path: str | Path | None = None,
        *,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        data_source: str | None = None,
        strict: bool = False,
        **env_kwargs: Any,
    ) -> None:
        dataset = load_prompts(
            path if path is not None else fixture_path(self.FIXTURE),
            prompt_key=prompt_key,
            answer_key=answer_key,
            data_source=data_source or self.DATA_SOURCE,
            strict=strict,
        )
        super().__init__(dataset, **env_kwargs)
