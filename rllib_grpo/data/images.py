"""Images of vision-language prompts: decoding a row's images, placing them in its chat
messages, and the vision inputs a trajectory carries to the learner.  No torch, no Ray.

A row names its images in a column (verl's ``data.image_key``, ``"images"`` by default) as
a list whose items are any of: verl's Geo3K parquet struct ``{"bytes": ..., "path": ...}``
(what ``datasets`` writes for an ``Image`` feature), encoded bytes, a file path (relative
paths from the prompt file's folder: JSONL with image paths) or a PIL image.  Each is
decoded once, when the data loads, to an RGB PIL image; the model's image processor
resizes it within its ``max_pixels`` when the prompt is rendered.  A row whose image does
not decode (missing file, truncated bytes, not an image) is a malformed row: counted and
skipped like any other (`rllib_grpo.envs.datasets.load_prompts`).

The prompt marks where each image goes with ``<image>`` in a message's text (verl's
convention, which Geo3K's ``problem`` column follows); `image_messages` turns such messages
into the content-part form chat templates of vision-language models take
(``[{"type": "image"}, {"type": "text", "text": ...}]``).
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rllib_grpo.envs.prompt_files import RowError

IMAGE_PLACEHOLDER = "<image>"
DEFAULT_IMAGE_KEY = "images"


@dataclasses.dataclass(frozen=True)
class VisionInputs:
    """The vision tower's inputs for one prompt, as its image processor made them.

    ``pixel_values``: (patches, channels x temporal patch x patch x patch) float32, every
    image's patches one after the other; ``image_grid_thw``: (images, 3) int64, each
    image's (temporal, height, width) patch grid.  The trajectories of one group share one
    object (a batch pickles it once).
    """

    pixel_values: np.ndarray
    image_grid_thw: np.ndarray


def decode_image(item: Any, base_dir: Path | None = None) -> Any:
    """One image of a row as an RGB PIL image; `RowError` if it does not decode.

    ``item``: ``{"bytes": b"...", "path": ...}`` (bytes win; a path alone is read), bytes,
    a path (relative to ``base_dir``) or a PIL image."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(item, Image.Image):
        return item.convert("RGB")
    if isinstance(item, Mapping):
        data, path = item.get("bytes"), item.get("path")
        item = data if data is not None else path
    try:
        if isinstance(item, bytes | bytearray | memoryview):
            image = Image.open(io.BytesIO(bytes(item)))
        elif isinstance(item, str | os.PathLike):
            path = Path(item).expanduser()
            if not path.is_absolute() and base_dir is not None:
                path = base_dir / path
            image = Image.open(path)
        else:
            raise RowError("malformed image", "each image is encoded bytes, a file path or "
                           "{'bytes': ..., 'path': ...}")
        return image.convert("RGB")  # decodes now: a truncated file fails here
    except FileNotFoundError:
        raise RowError("missing image file", "fix the image path (relative paths start "
                       "at the prompt file's folder) or drop the row") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError):
        raise RowError("malformed image", "the image bytes do not decode (truncated or not "
                       "an image): re-encode it or drop the row") from None


def decode_row_images(value: Any, base_dir: Path | None = None) -> tuple[Any, ...]:
    """A row's image column as decoded RGB images (an empty tuple for none)."""
    if value is None:
        return ()
    if hasattr(value, "tolist") and not isinstance(value, bytes):  # numpy from pandas/pyarrow
        value = value.tolist()
    if not isinstance(value, Sequence) or isinstance(value, str | bytes):
        value = [value]
    return tuple(decode_image(item, base_dir) for item in value)


def count_placeholders(prompt: str | Sequence[Mapping[str, Any]]) -> int:
    """How many ``<image>`` placeholders a prompt (text or chat messages) holds."""
    if isinstance(prompt, str):
        return prompt.count(IMAGE_PLACEHOLDER)
    return sum(str(message.get("content", "")).count(IMAGE_PLACEHOLDER) for message in prompt)


def check_placeholders(prompt: str | Sequence[Mapping[str, Any]], num_images: int) -> None:
    """`RowError` unless the prompt has one ``<image>`` per image (or none at all, when the
    images go before the first user message's text)."""
    found = count_placeholders(prompt)
    if found not in (0, num_images):
        raise RowError("image placeholders do not match images",
                       f"put one {IMAGE_PLACEHOLDER} in the prompt per image of the row "
                       f"({found} placeholders, {num_images} images)")


def image_messages(prompt: str | Sequence[Mapping[str, Any]], num_images: int
                   ) -> list[dict[str, Any]]:
    """Chat messages with image parts where ``<image>`` stood (verl's ``_build_messages``).

    A plain-text prompt becomes one user message.  Without any placeholder the images go
    first in the first user message (TRL's layout)."""
    messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                else [dict(message) for message in prompt])
    placed = count_placeholders(messages) > 0
    out: list[dict[str, Any]] = []
    for message in messages:
        content = str(message["content"])
        parts: list[dict[str, Any]] = []
        if not placed and num_images and message["role"] == "user":
            parts += [{"type": "image"}] * num_images
            placed = True
        for piece in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", content):
            if piece == IMAGE_PLACEHOLDER:
                parts.append({"type": "image"})
            elif piece:
                parts.append({"type": "text", "text": piece})
        out.append({**message, "content": parts})
    return out
