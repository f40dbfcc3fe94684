"""Vision-language models (the Qwen2-VL family): telling one from a text model, rendering
image prompts the way its processor does, and the tiny tokenizer of the built-in VLM.

`ImagePromptProcessor` does what transformers' ``Qwen2VLProcessor`` does for images: the
chat template renders one ``<|image_pad|>`` per image, the image processor turns the
images into patches (resized within its ``max_pixels``) and every ``<|image_pad|>`` is
repeated once per merged patch of its image (``grid_t * grid_h * grid_w / merge_size**2``).
It is built from the folder's tokenizer and image processor alone: transformers 5 builds a
``Qwen2VLProcessor`` only with its video processor, which needs torchvision, which has no
CPU build beside the CPU torch this package installs.  No Ray here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rllib_grpo.data.images import VisionInputs, image_messages
from rllib_grpo.models.model_registry import HUB_ID

# model_type of the vision-language families whose forward this package computes
# (``pixel_values``, ``image_grid_thw`` and multimodal rotary positions).
VISION_MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl")
IMAGE_TOKEN = "<|image_pad|>"
# The special tokens a Qwen2-VL chat template and processor use.
QWEN2_VL_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                           "<|vision_end|>", IMAGE_TOKEN, "<|video_pad|>")


def model_config_dict(path: str) -> dict[str, Any] | None:
    """A model's ``config.json`` as a dict: a folder's, or a hub id's from the local Hugging
    Face cache (nothing is downloaded); None where there is none."""
    folder = Path(os.path.expanduser(path))
    config = folder / "config.json"
    if not config.is_file() and not folder.exists() and HUB_ID.fullmatch(path):
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(path, "config.json")
        config = Path(cached) if isinstance(cached, str) else config
    return json.loads(config.read_text()) if config.is_file() else None


def vision_model_type(path: str) -> str | None:
    """The model type of a vision-language model (``"qwen2_vl"``, ``"llava"``, ...): its
    config (`model_config_dict`) has a ``vision_config``.  None for a text model or a hub id
    not in the local cache (`rllib_grpo.models.model_registry.architecture_of` names its family)."""
    config = model_config_dict(path)
    if not config or not isinstance(config.get("vision_config"), Mapping):
        return None
    return str(config.get("model_type") or "unknown")


def placeholder_token_ids(path: str) -> frozenset[int]:
    """The tokens a vision-language model's forward fills with image (or video) features:
    a response must not contain them (`rllib_grpo.samplers.base.cut_before`).  Empty for a
    text model."""
    config = model_config_dict(path) or {}
    if not isinstance(config.get("vision_config"), Mapping):
        return frozenset()
    return frozenset(int(config[key]) for key in ("image_token_id", "video_token_id")
                     if config.get(key) is not None)


def unsupported_vision_model(model_type: str | None) -> str | None:
    """Why a vision-language model type cannot be trained here (None: it can)."""
    if model_type is None or model_type in VISION_MODEL_TYPES:
        return None
    return (f"model_type={model_type!r}: this package computes the vision forward of the "
            f"Qwen2-VL family only ({', '.join(VISION_MODEL_TYPES)})")


class ImagePromptProcessor:
    """Renders prompts with images into token ids and vision inputs, as the model's
    processor does (module docstring).

    Args:
        tokenizer: the model's tokenizer, with a chat template that takes image parts.
        image_processor: the model's image processor (``Qwen2VLImageProcessor``).
    """

    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.image_processor = image_processor
        self.image_token_id = int(tokenizer.convert_tokens_to_ids(IMAGE_TOKEN))
        self.merge_size = int(image_processor.merge_size)

    @classmethod
    def from_pretrained(cls, path: str) -> ImagePromptProcessor:
        """The processor of a saved vision-language model folder."""
        from transformers import AutoImageProcessor

        from rllib_grpo.models.tokenizers import load_tokenizer

        return cls(load_tokenizer(path), AutoImageProcessor.from_pretrained(path))

    @property
    def max_pixels(self) -> int:
        """The most pixels an image keeps (larger ones are scaled down)."""
        return int(self.image_processor.size["longest_edge"])

    def vision_inputs(self, images: Sequence[Any]) -> VisionInputs:
        """The image processor's patches and patch grids of ``images`` (PIL, RGB)."""
        out = self.image_processor(images=list(images), return_tensors="np")
        return VisionInputs(np.asarray(out["pixel_values"], dtype=np.float32),
                            np.asarray(out["image_grid_thw"], dtype=np.int64))

    def image_token_counts(self, vision: VisionInputs) -> list[int]:
        """Tokens each image takes in the prompt (its merged patches)."""
        return [int(np.prod(grid)) // self.merge_size ** 2 for grid in vision.image_grid_thw]

    def image_size_tokens(self, width: int, height: int) -> int:
        """Tokens an image of this size takes: its patches after the processor's resize
        (`smart_resize`, within ``min_pixels`` and ``max_pixels``), merged."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import smart_resize

        size, patch = self.image_processor.size, int(self.image_processor.patch_size)
        resized_h, resized_w = smart_resize(height, width, factor=patch * self.merge_size,
                                            min_pixels=size["shortest_edge"],
                                            max_pixels=size["longest_edge"])
        return (resized_h // patch) * (resized_w // patch) // self.merge_size ** 2

    def num_prompt_tokens(self, prompt: str | Sequence[Mapping[str, Any]],
                          images: Sequence[Any]) -> int:
        """``len(encode(prompt, images)[1])`` from the images' sizes alone (no pixels
        processed)."""
        text = self.tokenizer.apply_chat_template(image_messages(prompt, len(images)),
                                                  tokenize=False, add_generation_prompt=True)
        text_tokens = len(self.tokenizer.encode(text, add_special_tokens=False))
        return text_tokens - len(images) + sum(self.image_size_tokens(*image.size)
                                               for image in images)

    def encode(self, prompt: str | Sequence[Mapping[str, Any]], images: Sequence[Any]
               ) -> tuple[str, list[int], VisionInputs]:
        """The rendered prompt (one ``<|image_pad|>`` per image), its token ids with every
        image's tokens expanded, and the vision inputs."""
        messages = image_messages(prompt, len(images))
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=True)
        vision = self.vision_inputs(images)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return text, expand_image_tokens(ids, self.image_token_id,
                                         self.image_token_counts(vision)), vision


def expand_image_tokens(token_ids: Sequence[int], image_token_id: int,
                        counts: Sequence[int]) -> list[int]:
    """``token_ids`` with the ``i``-th image token repeated ``counts[i]`` times."""
    placeholders = sum(1 for t in token_ids if t == image_token_id)
    if placeholders != len(counts):
        raise ValueError(f"the rendered prompt has {placeholders} image tokens for "
                         f"{len(counts)} images: the chat template must render one image "
                         "token per image part")
    out: list[int] = []
    images = iter(counts)
    for token in token_ids:
        out += [token] * next(images) if token == image_token_id else [token]
    return out


def collapse_image_tokens(token_ids: Sequence[int], image_token_id: int) -> list[int]:
    """The inverse of `expand_image_tokens`: every run of image tokens as one (the prompt
    form vLLM expands itself, from the images it is given)."""
    out: list[int] = []
    for token in token_ids:
        if not (token == image_token_id and out and out[-1] == image_token_id):
            out.append(token)
    return out


def build_byte_tokenizer(chat_template: str, special_tokens: Sequence[str] = QWEN2_VL_SPECIAL_TOKENS,
                         eos_token: str = "<|im_end|>", pad_token: str = "<|endoftext|>") -> Any:
    """A Qwen2 tokenizer over bytes alone: ids 0-255 are the bytes, the special tokens
    follow.  A byte-level BPE with no merges gives one token per byte, so transformers'
    ``Qwen2Tokenizer`` rebuilt from the saved vocabulary (what ``AutoTokenizer`` does for
    the qwen2 model types) encodes exactly as this one (the qwen2 tokenizer trap of
    `rllib_grpo.models.tokenizers` cannot bite)."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    byte_chars = bytes_to_unicode()
    vocab = {byte_chars[b]: b for b in range(256)}
    tokenizer = Qwen2Tokenizer(vocab=vocab, merges=[], eos_token=eos_token, pad_token=pad_token,
                               unk_token=None)
    tokenizer.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    tokenizer.chat_template = chat_template
    return tokenizer
