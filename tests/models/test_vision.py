"""The vision-language model pieces: the built-in tiny Qwen2-VL, its processor, and the
learner's forward over image prompts (`rllib_grpo.models.vision_forward`).

The learner's log-probs for image prompts, padded and packed, equal the model's own forward
of each row alone (transformers computing the multimodal positions itself), on a float64
model to the bound of `tests.conftest.float32_log_softmax_bound`: both sides round float64
logits that agree to ~1e-15 to float32 for the log-softmax.  transformers' Qwen2-VL takes
two float32 steps inside a float64 model (the text RMSNorm and the vision rotary
embedding); `float64_qwen2_vl` keeps them in float64 so that the logits do agree.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_grpo.data.rollout import build_rollout_batch
from rllib_grpo.envs.shape_count import make_shape_records
from rllib_grpo.models import load_causal_lm, resolve_model
from rllib_grpo.models.vision import (
    ImagePromptProcessor,
    collapse_image_tokens,
    expand_image_tokens,
    placeholder_token_ids,
)
from rllib_grpo.models.vision_forward import stacked_vision_inputs, vision_response_log_probs
from tests.conftest import float32_log_softmax_bound


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny-vlm", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def processor(model_path):
    return ImagePromptProcessor.from_pretrained(model_path)


def test_the_tokenizer_reloads_as_saved_and_the_model_is_a_qwen2_vl(model_path):
    """The byte-level tokenizer survives transformers' Qwen2 rebuild (AutoTokenizer)."""
    from transformers import AutoTokenizer

    from rllib_grpo.models.tokenizers import load_tokenizer

    saved, auto = load_tokenizer(model_path), AutoTokenizer.from_pretrained(model_path)
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Wie viele? 3 ü"
    assert auto.encode(text) == saved.encode(text) and len(auto) == len(saved)
    lm = load_causal_lm(model_path)
    assert type(lm).__name__ == "Qwen2VLForConditionalGeneration"
    assert len(saved) <= lm.config.get_text_config().vocab_size
    assert placeholder_token_ids(model_path) == {lm.config.image_token_id,
                                                 lm.config.video_token_id}


def test_prompts_expand_one_token_per_merged_patch(processor):
    records = make_shape_records(3, 0)
    for record in records:
        text, ids, vision = processor.encode(record.prompt, record.images)
        assert text.count("<|image_pad|>") == 1
        assert vision.image_grid_thw.tolist() == [[1, 6, 6]]  # 84 px / patch 14
        assert ids.count(processor.image_token_id) == 36 // 4 == 9
        assert vision.pixel_values.shape == (36, 3 * 2 * 14 * 14)
        assert processor.num_prompt_tokens(record.prompt, record.images) == len(ids)
        assert collapse_image_tokens(ids, processor.image_token_id) == \
            processor.tokenizer.encode(text, add_special_tokens=False)
    with pytest.raises(ValueError, match="2 image tokens for 1 images"):
        expand_image_tokens([5, 7, 5], 5, [4])


def _image_batch(processor, rows: int = 6, seed: int = 0):
    """Padded rows of real image prompts (two share each prompt, as a group) with random
    responses of 0-5 tokens, and the rows' vision inputs."""
    rng = np.random.default_rng(seed)
    records = make_shape_records(rows // 2, seed, max_count=5)
    prompts, responses, visions = [], [], []
    for i in range(rows):
        record = records[i // 2]
        _, ids, vision = processor.encode(record.prompt, record.images)
        prompts.append(ids[i % 3:])  # prompts of different lengths: left padding
        visions.append(vision)
        length = 0 if i == 0 else int(rng.integers(1, 6))
        responses.append(rng.integers(3, 250, size=length).tolist())
    built = build_rollout_batch(prompts, responses, [[0.0] * len(r) for r in responses],
                                [0.0] * rows, [i // 2 for i in range(rows)], [False] * rows,
                                [False] * rows, [{}] * rows,
                                pad_token_id=processor.tokenizer.pad_token_id,
                                multi_modal_inputs=visions)
    batch = {k: torch.as_tensor(getattr(built, k)) for k in (
        "prompt_ids", "prompt_mask", "response_ids", "response_mask")}
    batch["multi_modal_inputs"] = built.multi_modal_inputs
    return batch, prompts, responses, visions


def _own_forward(lm, prompt, response, vision, temperature):
    """The model's forward of one row alone, positions computed by transformers."""
    ids = torch.tensor([[*prompt, *response]])
    images = stacked_vision_inputs([vision], torch.device("cpu"), torch.float64)
    with torch.no_grad():
        logits = lm(input_ids=ids, mm_token_type_ids=(ids == lm.config.image_token_id).int(),
                    **images).logits[0, len(prompt) - 1:-1]
    log_probs = (logits.float() / temperature).log_softmax(-1)
    return logits, log_probs.gather(-1, torch.tensor(response)[:, None])[:, 0]


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_learner_log_probs_equal_the_models_own_forward(model_path, processor, packed,
                                                        float64_qwen2_vl):
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm = load_causal_lm(model_path).double()
    batch, prompts, responses, visions = _image_batch(processor)
    out = response_log_probs(lm, batch, 0.7, with_entropy=True, packed=packed)
    logit_scale = value_scale = diff = 0.0
    for row, (prompt, response, vision) in enumerate(zip(prompts, responses, visions,
                                                         strict=True)):
        if not response:
            continue
        logits, expected = _own_forward(lm, prompt, response, vision, 0.7)
        got = out["log_probs"][row, :len(response)]
        diff = max(diff, (got - expected).abs().max().item())
        logit_scale = max(logit_scale, logits.abs().max().item() / 0.7)
        value_scale = max(value_scale, expected.abs().max().item())
    assert diff <= float32_log_softmax_bound(logit_scale, value_scale), diff
    if packed:
        assert (out["log_probs"][~batch["response_mask"].bool()] == 0).all()


def test_images_change_the_log_probs(model_path, processor):
    """The check above can fail: another row's images give other log-probs."""
    lm = load_causal_lm(model_path)
    batch, _, _, visions = _image_batch(processor)
    swapped = dict(batch)
    swapped["multi_modal_inputs"] = np.array(visions[2:] + visions[:2] + [None] * 0,
                                             dtype=object)
    mask = batch["response_mask"].bool()
    with torch.no_grad():
        same = vision_response_log_probs(lm, batch, 1.0)["log_probs"]
        other = vision_response_log_probs(lm, swapped, 1.0)["log_probs"]
    assert (same - other)[mask].abs().max() > 1e-4


def test_gradients_reach_the_vision_tower_unless_frozen(model_path, processor):
    from rllib_grpo.models.vision_forward import vision_tower

    lm = load_causal_lm(model_path)
    batch, *_ = _image_batch(processor)
    vision_response_log_probs(lm, batch, 1.0, packed=True)["log_probs"].sum().backward()
    tower = vision_tower(lm)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in tower.parameters())
    lm.zero_grad(set_to_none=True)
    tower.requires_grad_(False)
    vision_response_log_probs(lm, batch, 1.0, packed=True)["log_probs"].sum().backward()
    assert all(p.grad is None for p in tower.parameters())
    assert lm.lm_head.weight.grad is not None
