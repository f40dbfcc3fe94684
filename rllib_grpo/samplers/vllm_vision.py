"""What a `rllib_grpo.samplers.vllm.VLLMSampler` does differently for a vision-language
model: its engine arguments, its requests, and whether vLLM can run it here at all.

Requests carry the prompt's images as vLLM's ``multi_modal_data`` and the prompt's token ids
with one ``<|image_pad|>`` per image (verl's ``raw_prompt_ids``): vLLM's processor expands
each into the image's tokens itself, from the same image processor settings (the model
folder's), so the engine's prompt is the one the learner scores.  vLLM imports
transformers' Qwen2-VL image processor module, which imports torchvision: where torchvision
does not import (CPU installs of this package: PyPI's torchvision is built for CUDA), a
vision-language model samples with the transformers sampler.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from rllib_grpo.models.vision import (
    collapse_image_tokens,
    model_config_dict,
    vision_model_type,
)


@functools.cache
def torchvision_imports() -> bool:
    """Whether ``import torchvision`` succeeds in this environment."""
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001  (missing, or a build for another torch: either way no)
        return False
    return True


def vllm_vision_error(model_path: str, is_vision: bool | None = None) -> str | None:
    """Why vLLM cannot sample from the vision-language model at ``model_path`` here (None:
    it can, or the model is a text model).  ``is_vision``: whether it is one, where the
    caller knows (a built-in not built yet); None reads the folder's config."""
    if is_vision is None:
        is_vision = vision_model_type(model_path) is not None
    if not is_vision or torchvision_imports():
        return None
    return (f"sampler='vllm' with the vision-language model {model_path}: vLLM's Qwen2-VL "
            "imports torchvision, which does not import here (no CPU build beside this "
            "torch); use sampler='hf' (the transformers sampler takes the images too), or "
            "run on a GPU machine with torchvision installed")


def vision_engine_args(model_path: str) -> dict[str, Any]:
    """Engine arguments a vision-language model needs: its tokenizer (vLLM's multimodal
    processor renders with it) and no video inputs (none are sent; vLLM would otherwise
    size its profiling for videos)."""
    if vision_model_type(model_path) is None:
        return {}
    return {"skip_tokenizer_init": False, "limit_mm_per_prompt": {"video": 0}}


def image_token_id(model_path: str) -> int | None:
    """The image token of a vision-language model folder (None: a text model)."""
    config = model_config_dict(model_path) or {}
    token = config.get("image_token_id")
    return int(token) if token is not None else None


def vllm_requests(prompts: Sequence[Sequence[int]], images: Sequence[Sequence[Any]] | None,
                  image_token: int | None) -> list[dict[str, Any]]:
    """vLLM prompts: token ids, and for a prompt with images its ``multi_modal_data`` with
    its image tokens collapsed to one per image (vLLM expands them)."""
    requests: list[dict[str, Any]] = []
    for i, prompt in enumerate(prompts):
        prompt_images = list(images[i]) if images is not None else []
        if not prompt_images:
            requests.append({"prompt_token_ids": list(prompt)})
            continue
        if image_token is None:
            raise ValueError("prompts with images need a vision-language model; this "
                             "engine's model is text-only")
        requests.append({"prompt_token_ids": collapse_image_tokens(prompt, image_token),
                         "multi_modal_data": {"image": prompt_images}})
    return requests
