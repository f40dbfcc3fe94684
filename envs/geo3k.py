"""Geo3K (geometry problems with a figure each), over verl's preprocessed parquet.

verl's Geo3K preprocessing script (``data_preprocess/geo3k.py``) writes rows with ``prompt`` (one user message
whose text starts with ``<image>``), ``images`` (the figure as ``{"bytes", "path"}``),
``reward_model.ground_truth`` and ``data_source="hiyouga/geometry3k"``: pass that file as
``path`` (verl's ``data.train_files``).  Scored by verl's geo3k reward
(`rllib_grpo.rewards.geo3k_score`); a vision-language model's ``processor`` renders the figure.
"""

from __future__ import annotations

from typing import ClassVar

from rllib_grpo.envs._file_env import FilePromptEnv

DATA_SOURCE = "hiyouga/geometry3k"


class Geo3KEnv(FilePromptEnv):
    """``rllib_grpo/Geo3K-v0``: verl's Geo3K parquet (``path`` required: no fixture is
    shipped, the figures are the dataset's)."""

    FIXTURE: ClassVar[str | None] = None
    DATA_SOURCE: ClassVar[str | None] = DATA_SOURCE
