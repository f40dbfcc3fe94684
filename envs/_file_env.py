"""Base for envs over a prompt file, defaulting to a fixture shipped in ``envs/data``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from rllib_grpo.data.images import DEFAULT_IMAGE_KEY
from rllib_grpo.envs.datasets import PromptDataset, load_prompts
from rllib_grpo.envs.text import TextEnv


def fixture_path(file_name: str) -> Path:
    """Path of a fixture file shipped in ``rllib_grpo/envs/data``."""
    return Path(str(resources.files("rllib_grpo.envs") / "data" / file_name))


def load_prompt_files(paths: str | Path | Sequence[str | Path], **load_kwargs: Any
                      ) -> PromptDataset:
    """One dataset from a file or a list of files (verl's ``data.train_files`` may be a
    list: their rows are concatenated in order); ``~`` is expanded."""
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    datasets = [load_prompts(Path(path).expanduser(), **load_kwargs) for path in files]
    if len(datasets) == 1:
        return datasets[0]
    skipped: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for dataset in datasets:
        skipped.update(dataset.skipped)
        reasons = {**dataset.skip_reasons, **reasons}
    return PromptDataset([record for dataset in datasets for record in dataset],
                         skipped=skipped, skip_reasons=reasons,
                         name=" + ".join(dataset.name for dataset in datasets))


class FilePromptEnv(TextEnv):
    """A :class:`~rllib_grpo.envs.text.TextEnv` over ``path`` (verl or plain rows; one file
    or a list of files).

    Rows without a ``data_source`` get :attr:`DATA_SOURCE`. With ``path=None`` the
    shipped :attr:`FIXTURE` is used (a few dozen rows, for smoke tests and demos).
    ``image_key``: the column of a row's images (verl's ``data.image_key``).
    """

    FIXTURE: ClassVar[str | None]
    DATA_SOURCE: ClassVar[str | None]

    def __init__(
        self,
        path: str | Path | Sequence[str | Path] | None = None,
        *,
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        data_source: str | None = None,
        strict: bool = False,
        image_key: str = DEFAULT_IMAGE_KEY,
        **env_kwargs: Any,
    ) -> None:
        if path is None:
            if self.FIXTURE is None:
                raise ValueError(f"{type(self).__name__} needs path=... (a prompt file or a "
                                 "list of them: verl's data.train_files)")
            path = fixture_path(self.FIXTURE)
        dataset = load_prompt_files(
            path,
            prompt_key=prompt_key,
            answer_key=answer_key,
            data_source=data_source or self.DATA_SOURCE,
            strict=strict,
            image_key=image_key,
        )
        super().__init__(dataset, **env_kwargs)


class PromptFileEnv(FilePromptEnv):
    """Prompts from verl-format files (``rllib_grpo/Prompts-v0``): each row's
    ``data_source`` picks its reward function, as verl's reward manager does.  The env
    ``data.train_files``/``data.val_files`` select when no env is named."""

    FIXTURE = None
    DATA_SOURCE = None
