"""The door's checks and `explain`'s lines for prompts with images (vision-language GRPO).

Before anything starts: data whose rows carry images needs a vision-language model of the
Qwen2-VL family (one line naming the fix otherwise), vLLM on this machine's CPU needs
torchvision to run one,
``freeze_vision_tower`` needs a vision tower, and continuous rollouts take text prompts
only.  `explain` states the image tokens per prompt (measured by the door's prompt measure,
`rllib_grpo.rllib.config.prompt_lengths`) and what the vision tower adds to a learner's
memory (`vision_memory_rows`).  No Ray here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rllib_grpo.data.images import DEFAULT_IMAGE_KEY
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.text_env import env_class

# The built-in vision-language models (`rllib_grpo.models.demo_vlm`), known before they
# are built.
VISION_BUILTINS = ("builtin:tiny-vlm", "builtin:demo-vlm")
VISION_ACTIVATION_VALUES = 17  # as memory.ACTIVATION_VALUES, per patch and vision layer


def model_vision_type(model_path: str) -> str | None:
    """The vision-language model type of ``model_path`` (a folder, a built-in name or a hub
    id, by its family name); None for a text model."""
    from rllib_grpo.models.model_registry import architecture_of, needs_build, resolve_model
    from rllib_grpo.models.vision import VISION_MODEL_TYPES, vision_model_type

    if model_path in VISION_BUILTINS:
        return "qwen2_vl"
    if model_path.startswith("builtin:") and not needs_build(model_path):
        model_path = resolve_model(model_path)
    if Path(model_path).expanduser().is_dir():
        return vision_model_type(str(Path(model_path).expanduser()))
    arch = architecture_of(model_path)
    return arch if arch in VISION_MODEL_TYPES else None


def processor_for(model_path: str) -> Any:
    """The image processor of a vision-language model at hand (a folder, or a built-in,
    which is built), None for a text model or a hub id (nothing is downloaded here)."""
    if not isinstance(model_path, str) or model_vision_type(model_path) is None:
        return None
    from rllib_grpo.models.model_registry import resolve_model
    from rllib_grpo.models.vision import ImagePromptProcessor

    folder = Path(resolve_model(model_path)).expanduser()
    return ImagePromptProcessor.from_pretrained(str(folder)) if folder.is_dir() else None


def _first_row_has_images(path: Path, image_key: str) -> bool:
    """Whether a data file's rows carry images: a Parquet file has the column, a JSONL
    file's first row a non-empty value under it."""
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            return image_key in pq.read_schema(path).names
        with path.open("rb") as file:
            first = next((line for line in file if line.strip()), b"")
        row = json.loads(first) if first else {}
        return bool(isinstance(row, dict) and row.get(image_key))
    except Exception:  # noqa: BLE001  (unreadable data is the data checks' to report)
        return False


def data_with_images(c: GRPOSettings) -> str | None:
    """Where the run's prompts carry images (an env that draws pictures, or a data file
    with an image column), as the field to name; None for text data."""
    cls = env_class(getattr(c, "env", None))
    if cls is not None and getattr(cls, "IMAGES", False):
        return f"env={c.env!r}"
    for field in ("env_config", "val_env_config"):
        settings = getattr(c, field, None) or {}
        paths = settings.get("path")
        image_key = settings.get("image_key", DEFAULT_IMAGE_KEY)
        for path in paths if isinstance(paths, list | tuple) else [paths]:
            if isinstance(path, str) and _first_row_has_images(Path(path).expanduser(),
                                                               image_key):
                return f"{field}.path {path} (column {image_key!r})"
    return None


def vision_errors(c: GRPOSettings) -> list[str]:
    """What cannot run with images (module docstring), each naming the fix."""
    from rllib_grpo.models.vision import unsupported_vision_model
    from rllib_grpo.samplers.vllm_vision import vllm_vision_error

    model_path = getattr(c, "model_path", None)
    if not isinstance(model_path, str):
        return []
    vision = model_vision_type(model_path)
    images = data_with_images(c)
    errors = []
    if images and vision is None:
        errors.append(
            f"{images}: the prompts carry images but model_path={model_path!r} is a "
            "text-only model; use a vision-language model (model_path='builtin:demo-vlm', "
            "a Qwen2-VL or Qwen2.5-VL folder), or point env_config.image_key (verl "
            "data.image_key) at no column to train on the text alone.")
    if why := unsupported_vision_model(vision):
        errors.append(f"model_path={model_path!r}: {why}.")
    # vLLM on this machine's CPU (a GPU layout samples on GPU machines, which have theirs).
    on_cpu_here = not (c.num_gpus_per_env_runner or 0)
    if c.sampler == "vllm" and on_cpu_here and (
            why := vllm_vision_error(model_path, vision is not None)):
        errors.append(why + ".")
    if c.freeze_vision_tower and vision is None:
        errors.append(f"freeze_vision_tower=True (verl actor.freeze_vision_tower) needs a "
                      f"vision-language model; model_path={model_path!r} has no vision tower.")
    if images and c.resolved_rollout_mode() == "continuous":
        errors.append("rollout_mode='continuous' streams text prompts only; prompts with "
                      "images sample step by step: use max_staleness <= 1.")
    return errors


def image_tokens(c: GRPOSettings) -> tuple[int, ...]:
    """Image tokens of every training prompt, as the door measured them (empty where it
    could not: no images, or a model not at hand)."""
    from rllib_grpo.rllib.config.prompt_lengths import training_prompt_lengths

    measured = training_prompt_lengths(c)
    return measured.image_tokens if measured is not None else ()


def vision_lines(c: GRPOSettings) -> list[str]:
    """`explain`'s line on images (a vision-language model's run): image tokens per prompt
    as measured, and how the learner computes them."""
    model_path = getattr(c, "model_path", None)
    if not isinstance(model_path, str) or model_vision_type(model_path) is None:
        return []
    tokens = image_tokens(c)
    measured = (f"{min(tokens)}-{max(tokens)} image tokens per prompt (mean "
                f"{sum(tokens) / len(tokens):.0f}), inside max_prompt_length="
                f"{c.max_prompt_length}" if tokens else
                "image tokens per prompt not measured (the data or the model is not at "
                "hand); they count in max_prompt_length")
    forward = ("packed rows, one sequence per trajectory" if c.use_remove_padding
               else "padded rows")
    tower = ("frozen (freeze_vision_tower)" if c.freeze_vision_tower
             else "trained, in every weight sync")
    return [f"images:                        {measured}; image prompts' learner forwards on "
            f"{forward}; vision tower {tower}"]


def vision_memory_rows(c: GRPOSettings, micro_batch_prompts: int, bytes_per_value: int
                       ) -> dict[str, float]:
    """A learner's vision-tower activations for one micro-batch (patches x width x depth x
    `VISION_ACTIVATION_VALUES` values); nothing for text data or an unreadable model."""
    from rllib_grpo.models.model_registry import resolve_model
    from rllib_grpo.models.vision import model_config_dict

    tokens = image_tokens(c)
    if not tokens:
        return {}
    try:
        config = model_config_dict(resolve_model(c.model_path)) or {}
    except Exception:  # noqa: BLE001  (no model at hand: no row)
        return {}
    vision: dict[str, Any] = config.get("vision_config") or {}
    width = vision.get("embed_dim") or vision.get("hidden_size")
    depth, merge = vision.get("depth"), vision.get("spatial_merge_size", 2)
    if not (isinstance(width, int) and isinstance(depth, int)):
        return {}
    patches = max(tokens) * merge * merge * micro_batch_prompts
    values = patches * width * depth * VISION_ACTIVATION_VALUES
    return {"vision activations": float(values * bytes_per_value)}
