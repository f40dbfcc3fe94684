"""The learner's forward pass of a vision-language model (the Qwen2-VL family) over image
prompts: the response tokens' log-probs (and entropies) with the images in the forward.

Each trajectory's row carries its prompt's `rllib_grpo.data.images.VisionInputs` (the
``multi_modal_inputs`` column, verl's name).  A micro-batch's images go into the forward
as one ``pixel_values`` tensor and one ``image_grid_thw`` (rows in order), the vision tower
encodes them and the model puts each image's embeddings where its ``<|image_pad|>`` tokens
are.  Positions are the model's multimodal rotary positions (``get_rope_index``: a
(temporal, height, width) triple per token, image tokens laid out on their patch grid),
computed per sequence from the tokens and the grids.

* **padded rows** (``use_remove_padding=False``): the padded micro-batch with its attention
  mask and the (3, B, L) positions;
* **packed rows** (``use_remove_padding=True``, the default): the sequences packed as
  `rllib_grpo.models.packing` packs text (first-fit decreasing; one row with a varlen
  kernel), their positions moved with their tokens and the text positions (restarting at 0
  per sequence) in front as the fourth row transformers' Qwen2-VL reads to confine
  attention to each sequence; the images in the order their tokens appear in the packed
  rows.  transformers' Qwen2-VL and Qwen2.5-VL take both layouts (``position_ids`` of
  shape (4, rows, length)); the values equal the padded ones to float precision
  (``tests/models/test_vision.py``).

Shared-prompt packing (`rllib_grpo.models.shared_prefix`) is not used for image prompts:
they pack one sequence per trajectory.  No Ray here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from rllib_grpo.algos import entropy_from_logits, logprobs_from_logits
from rllib_grpo.algos.token_stats import chunked_token_stats
from rllib_grpo.data.images import VisionInputs
from rllib_grpo.models.lm_head import token_stats_mode
from rllib_grpo.models.packing import (
    pack_micro_batch,
    packed_response_log_probs,
    uses_varlen_attention,
)

VISION_COLUMN = "multi_modal_inputs"


def has_vision_inputs(batch: dict[str, Any]) -> bool:
    """Whether a micro-batch's rows carry images."""
    visions = batch.get(VISION_COLUMN)
    return visions is not None and any(v is not None for v in visions)


def vision_model(lm: torch.nn.Module) -> Any:
    """The image-text model inside ``lm`` (a transformers ``...ForConditionalGeneration``,
    possibly peft-wrapped): the module with ``get_rope_index`` and the vision tower."""
    base: Any = lm
    if hasattr(base, "get_base_model"):  # peft
        base = base.get_base_model()
    return base.model


def vision_tower(lm: torch.nn.Module) -> torch.nn.Module:
    """The vision encoder of ``lm`` (with its merger into the language model's width)."""
    return vision_model(lm).visual


def stacked_vision_inputs(visions: Sequence[VisionInputs | None], device: torch.device,
                          dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """``pixel_values`` and ``image_grid_thw`` of ``visions`` one after the other (rows
    without images skipped), for one forward."""
    present = [v for v in visions if v is not None]
    return {
        "pixel_values": torch.from_numpy(np.concatenate([v.pixel_values for v in present]))
        .to(device=device, dtype=dtype),
        "image_grid_thw": torch.from_numpy(np.concatenate([v.image_grid_thw for v in present]))
        .to(device),
    }


def rope_positions(lm: torch.nn.Module, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, image_grid_thw: torch.Tensor) -> torch.Tensor:
    """(3, B, L) multimodal rotary positions of padded rows (padding positions 0).  Image
    tokens appear in prompts only: the samplers end a response before any
    (`rllib_grpo.samplers.base.cut_before`)."""
    model = vision_model(lm)
    image_token_id = model.config.image_token_id
    return model.get_rope_index(input_ids, mm_token_type_ids=(input_ids == image_token_id).int(),
                                image_grid_thw=image_grid_thw,
                                attention_mask=attention_mask)[0]


def vision_response_log_probs(
    lm: torch.nn.Module,
    batch: dict[str, Any],
    temperature: float,
    with_entropy: bool = False,
    *,
    packed: bool = False,
    detach_entropy: bool = False,
    token_stats: str = "full",
) -> dict[str, torch.Tensor]:
    """`rllib_grpo.rllib.learner.module.response_log_probs` for rows with images (same
    arguments and result; ``batch`` also holds the rows' ``multi_modal_inputs``)."""
    input_ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1).long()
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    weight = next(lm.parameters())
    visions = list(batch[VISION_COLUMN])
    images = stacked_vision_inputs(visions, weight.device, weight.dtype)
    positions = rope_positions(lm, input_ids, attention_mask, images["image_grid_thw"])
    if packed:
        layout = _packed_layout(lm, batch, positions, visions, images)
        return packed_response_log_probs(lm, batch, temperature, with_entropy,
                                         detach_entropy=detach_entropy, layout=layout,
                                         token_stats=token_stats)
    # The logits at the last prompt token and every response token but the last predict
    # the response tokens.
    width = batch["response_ids"].shape[1]
    logits = lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                use_cache=False, logits_to_keep=width + 1, **images).logits[:, :-1]
    shape = batch["response_ids"].shape
    out: dict[str, torch.Tensor] = {}
    if token_stats_mode(lm, token_stats) != "full":
        log_probs, entropy = chunked_token_stats(
            logits.reshape(-1, logits.shape[-1]), batch["response_ids"].reshape(-1),
            temperature, with_entropy=with_entropy, stats_dtype=torch.float32)
        out["log_probs"] = log_probs.view(shape)
        if entropy is not None:
            out["entropy"] = (entropy.detach() if detach_entropy else entropy).view(shape)
        return out
    response_logits = logits.float() / temperature
    out["log_probs"] = logprobs_from_logits(response_logits, batch["response_ids"].long())
    if with_entropy:
        with torch.set_grad_enabled(torch.is_grad_enabled() and not detach_entropy):
            out["entropy"] = entropy_from_logits(response_logits)
    return out


def _packed_layout(lm: torch.nn.Module, batch: dict[str, Any], positions: torch.Tensor,
                   visions: list[VisionInputs | None], images: dict[str, torch.Tensor]) -> Any:
    """`pack_micro_batch`'s layout with the multimodal positions moved along with the
    tokens (text positions first: the fourth row) and the images in packed order."""
    layout = pack_micro_batch(batch, varlen=uses_varlen_attention(lm))
    assert layout.source_index is not None and layout.packed_index is not None
    rows, row_len = layout.input_ids.shape
    source = torch.from_numpy(layout.source_index).to(positions.device)
    slots = torch.from_numpy(layout.packed_index).to(positions.device)
    spatial = positions.new_zeros(3, rows * row_len)
    spatial[:, slots] = positions.reshape(3, -1)[:, source]
    position_ids = torch.cat([layout.position_ids[None], spatial.view(3, rows, row_len)])
    # The model fills image tokens in row-major order of the packed rows: each sequence's
    # tokens are contiguous, so sequences in the order of their first slot.
    width = batch["prompt_ids"].shape[1] + batch["response_ids"].shape[1]
    sequence_of = layout.source_index // width
    first_slot: dict[int, int] = {}
    for sequence, slot in zip(sequence_of.tolist(), layout.packed_index.tolist(), strict=True):
        first_slot.setdefault(sequence, slot)
    order = sorted(first_slot, key=first_slot.__getitem__)
    weight = images["pixel_values"]
    packed_images = stacked_vision_inputs([visions[i] for i in order], weight.device,
                                          weight.dtype)
    return dataclasses.replace(layout, position_ids=position_ids, model_inputs=packed_images)
