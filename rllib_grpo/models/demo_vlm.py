"""The built-in vision-language models: ``"builtin:tiny-vlm"`` (random) and
``"builtin:demo-vlm"`` (a few seconds of supervised warm-up on the counting task).

Both are Qwen2-VL models built in code, no hub: a byte-level tokenizer with Qwen2-VL's
special tokens and a chat template that renders image parts
(`rllib_grpo.models.vision.build_byte_tokenizer`), Qwen2-VL's image processor fixed to the
task's picture size, a one-block vision tower (patch 14, 2x2 merge: one image token per
28x28 cell) and a two-layer language model with head size 32 (one vLLM accepts).

``builtin:demo-vlm`` does for pictures what ``builtin:demo`` does for sums: a randomly
initialised model earns no reward, so its groups carry no signal; a short warm-up on
`rllib_grpo.envs.shape_count` demonstrations (``<image>How many shapes?`` -> ``3``) teaches the
answer format and a little counting, and GRPO takes it from there (docs/vision.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rllib_grpo.data.images import VisionInputs
from rllib_grpo.envs.shape_count import make_shape_records
from rllib_grpo.models.loading import ModelAndTokenizer
from rllib_grpo.models.model_registry import register_builtin_model
from rllib_grpo.models.vision import ImagePromptProcessor, build_byte_tokenizer
from rllib_grpo.models.vision_forward import rope_positions, stacked_vision_inputs

# Qwen2-VL's chat layout without its default system turn: every prompt token counts on CPU.
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif part['type'] == 'text' %}"
    "{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
PATCH_SIZE, MERGE_SIZE = 14, 2


def tiny_vlm_processor(image_side: int) -> ImagePromptProcessor:
    """The built-in VLMs' tokenizer and image processor, for square pictures of
    ``image_side`` pixels (a multiple of 28: kept at that size)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    pixels = image_side * image_side
    image_processor = Qwen2VLImageProcessorPil(min_pixels=pixels, max_pixels=pixels,
                                               patch_size=PATCH_SIZE, merge_size=MERGE_SIZE)
    return ImagePromptProcessor(build_byte_tokenizer(CHAT_TEMPLATE), image_processor)


def build_tiny_vlm(tokenizer: Any, *, hidden_size: int = 64, num_layers: int = 2,
                   num_heads: int = 2, num_kv_heads: int = 1, intermediate_size: int = 128,
                   vision_depth: int = 1, vision_dim: int = 64, vision_heads: int = 2,
                   max_position_embeddings: int = 512, seed: int = 0) -> Any:
    """A randomly initialised fp32 Qwen2-VL model sized for ``tokenizer`` (eval mode; the
    global RNG is left as it was)."""
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    head_dim = hidden_size // num_heads
    # mrope_section splits the rotary half-dimension among (temporal, height, width) in
    # Qwen2-VL's proportions (16, 24, 24 of 64).
    half = head_dim // 2
    spatial = (half - half // 4) // 2
    mrope_section = [half - 2 * spatial, spatial, spatial]
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in (
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
        ("vision_start_token_id", "<|vision_start|>"),
        ("vision_end_token_id", "<|vision_end|>"))}
    config = Qwen2VLConfig(
        text_config={
            "vocab_size": len(tokenizer), "hidden_size": hidden_size,
            "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
            "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads,
            "max_position_embeddings": max_position_embeddings, "tie_word_embeddings": True,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10_000.0,
                                "mrope_section": mrope_section},
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None},
        vision_config={
            "depth": vision_depth, "embed_dim": vision_dim, "hidden_size": hidden_size,
            "num_heads": vision_heads, "mlp_ratio": 2, "patch_size": PATCH_SIZE,
            "spatial_merge_size": MERGE_SIZE, "temporal_patch_size": 2, "in_channels": 3},
        tie_word_embeddings=True, **ids)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model.eval()


def _build_tiny_vlm(*, image_side: int, seed: int, **model_kwargs: Any) -> ModelAndTokenizer:
    processor = tiny_vlm_processor(image_side)
    model = build_tiny_vlm(processor.tokenizer, seed=seed, **model_kwargs)
    return model, processor.tokenizer, processor.image_processor


def vision_sft(model: Any, examples: Sequence[tuple[list[int], list[int], VisionInputs]], *,
               pad_id: int, steps: int, lr: float, batch_size: int, seed: int,
               max_grad_norm: float = 1.0) -> list[float]:
    """Supervised fine-tuning on ``(token ids, labels, images)`` examples, in place (labels
    -100 where no loss applies); returns every step's loss, leaves eval mode."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        rows = [examples[i] for i in picks]
        width = max(len(ids) for ids, _, _ in rows)
        input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for row, (ids, row_labels, _) in enumerate(rows):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            labels[row, :len(ids)] = torch.tensor(row_labels)
            attention_mask[row, :len(ids)] = 1
        images = stacked_vision_inputs([v for _, _, v in rows], torch.device("cpu"),
                                       torch.float32)
        positions = rope_positions(model, input_ids, attention_mask, images["image_grid_thw"])
        loss = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                     labels=labels, use_cache=False, **images).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def build_demo_vlm(*, version: int, seed: int, grid: int, cell: int, max_count: int,
                   num_prompts: int, warmup_steps: int, lr: float, batch_size: int,
                   **model_kwargs: Any) -> ModelAndTokenizer:
    """The tiny VLM after a short warm-up on counting demonstrations (module docstring)."""
    processor = tiny_vlm_processor(grid * cell)
    tokenizer = processor.tokenizer
    model = build_tiny_vlm(tokenizer, seed=seed, **model_kwargs)
    examples = []
    for record in make_shape_records(num_prompts, seed, grid=grid, cell=cell,
                                      max_count=max_count):
        _, prompt_ids, vision = processor.encode(record.prompt, record.images)
        answer = [*tokenizer.encode(str(record.ground_truth), add_special_tokens=False),
                  tokenizer.eos_token_id]
        examples.append((prompt_ids + answer, [-100] * len(prompt_ids) + answer, vision))
    vision_sft(model, examples, pad_id=tokenizer.pad_token_id, steps=warmup_steps, lr=lr,
               batch_size=batch_size, seed=seed)
    return model, tokenizer, processor.image_processor


TINY_VLM_PARAMS: dict[str, Any] = {"image_side": 84, "seed": 0}
DEMO_VLM_PARAMS: dict[str, Any] = {
    "version": 1, "seed": 0, "grid": 3, "cell": 28, "max_count": 5, "num_prompts": 2048,
    "warmup_steps": 150, "lr": 1e-3, "batch_size": 32,
}

register_builtin_model("builtin:tiny-vlm", _build_tiny_vlm, params=TINY_VLM_PARAMS)
register_builtin_model("builtin:demo-vlm", build_demo_vlm, params=DEMO_VLM_PARAMS)
