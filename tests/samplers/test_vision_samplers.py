"""Samplers with image prompts (`rllib_grpo.samplers`): the transformers sampler's log-probs
equal the model's own forward (float64, the text tests' bound); vLLM's requests carry the
images with one image token per image; a response never holds an image placeholder; and
vLLM's log-probs match the transformers sampler's where vLLM can run a Qwen2-VL (it needs
torchvision, which has no CPU build beside this package's CPU torch)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from rllib_grpo.envs.shape_count import make_shape_records
from rllib_grpo.models import load_causal_lm, resolve_model
from rllib_grpo.models.vision import ImagePromptProcessor
from rllib_grpo.models.vision_forward import stacked_vision_inputs
from rllib_grpo.samplers import SamplingParams, make_sampler
from rllib_grpo.samplers.base import Sample, cut_before
from rllib_grpo.samplers.hf import HFSampler
from rllib_grpo.samplers.vllm_vision import vllm_requests, vllm_vision_error
from tests.conftest import float32_log_softmax_bound
from tests.helpers.log_probs import mean_log_prob

PARAMS = SamplingParams(temperature=0.8, max_tokens=6)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny-vlm", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def prompts(model_path):
    processor = ImagePromptProcessor.from_pretrained(model_path)
    records = make_shape_records(3, 0)
    encoded = [processor.encode(r.prompt, r.images) for r in records]
    return [ids for _, ids, _ in encoded], [r.images for r in records], [v for *_, v in encoded]


def _forward_log_probs(model, prompt, vision, sample, temperature):
    ids = torch.tensor([[*prompt, *sample.token_ids]])
    images = stacked_vision_inputs([vision], torch.device("cpu"), torch.float64)
    with torch.no_grad():
        logits = model(input_ids=ids, mm_token_type_ids=(ids == model.config.image_token_id)
                       .int(), **images).logits[0, len(prompt) - 1:-1] / temperature
    log_probs = logits.float().log_softmax(-1)
    return logits, log_probs.gather(-1, torch.tensor(sample.token_ids)[:, None])[:, 0]


def test_hf_log_probs_equal_the_models_forward(model_path, prompts, float64_qwen2_vl):  # noqa: F811
    token_ids, images, visions = prompts
    sampler = HFSampler(model_path, seed=0)
    sampler.model.double()
    groups = sampler.generate(token_ids, 4, PARAMS, images=images)
    assert mean_log_prob(groups) < -0.5  # a spread-out policy: the check has teeth
    model = load_causal_lm(model_path).double()
    diff = logit_scale = value_scale = 0.0
    for prompt, vision, group in zip(token_ids, visions, groups, strict=True):
        for sample in group:
            if not sample.token_ids:
                continue
            logits, expected = _forward_log_probs(model, prompt, vision, sample, 0.8)
            diff = max(diff, (torch.tensor(sample.log_probs) - expected).abs().max().item())
            logit_scale = max(logit_scale, logits.abs().max().item())
            value_scale = max(value_scale, expected.abs().max().item())
    assert diff <= float32_log_softmax_bound(logit_scale, value_scale), diff


def test_the_images_decide_the_samples(model_path, prompts):
    token_ids, images, _ = prompts
    sampler = HFSampler(model_path, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=4)
    with torch.no_grad():
        same = sampler.generate(token_ids, 1, params, images=images)
        swapped = sampler.generate(token_ids, 1, params, images=images[1:] + images[:1])
    assert same == sampler.generate(token_ids, 1, params, images=images)
    assert [g[0].log_probs for g in same] != [g[0].log_probs for g in swapped]
    with pytest.raises(ValueError, match="text-only"):
        vllm_requests(token_ids, images, None)


def test_a_response_ends_before_an_image_placeholder():
    sample = Sample([5, 9, 261, 4], [-0.1, -0.2, -0.3, -0.4], "stop")
    assert cut_before(sample, frozenset({261, 262})) == Sample([5, 9], [-0.1, -0.2], "length")
    assert cut_before(sample, frozenset({7})) is sample


def test_vllm_requests_carry_the_images_and_one_token_per_image(prompts):
    token_ids, images, _ = prompts
    image_token = 261
    requests = vllm_requests(token_ids[:2] + [[1, 2]], images[:2] + [()], image_token)
    for request, ids, pictures in zip(requests[:2], token_ids, images, strict=False):
        assert request["prompt_token_ids"].count(image_token) == 1
        assert len(request["prompt_token_ids"]) == len(ids) - 8  # nine tokens -> one
        assert request["multi_modal_data"] == {"image": list(pictures)}
    assert requests[2] == {"prompt_token_ids": [1, 2]}


def test_vllm_without_torchvision_is_refused_naming_the_fix(model_path, monkeypatch):
    from rllib_grpo.samplers import vllm_vision

    monkeypatch.setattr(vllm_vision, "torchvision_imports", lambda: False)
    assert "use sampler='hf'" in vllm_vision_error(model_path)
    assert vllm_vision_error(resolve_model("builtin:tiny")) is None  # a text model
    if importlib.util.find_spec("vllm") is not None:  # "auto": transformers, with a warning
        assert isinstance(make_sampler("auto", model_path=model_path), HFSampler)
    monkeypatch.setattr(vllm_vision, "torchvision_imports", lambda: True)
    assert vllm_vision_error(model_path) is None


@pytest.mark.vllm_vision
def test_vllm_and_transformers_give_the_same_log_probs(model_path, prompts):
    """vLLM's sampled tokens scored by the transformers sampler's model: the text tests'
    tolerance (tests/samplers/test_vllm.py).  Needs vLLM with torchvision (a CUDA machine):
    not collected by default (`-m vllm_vision` runs it; it fails, never skips, without
    them)."""
    token_ids, images, visions = prompts
    sampler = make_sampler("vllm", model_path=model_path, seed=0)
    try:
        groups = sampler.generate(token_ids, 4, PARAMS, images=images)
    finally:
        sampler.close()
    model = load_causal_lm(model_path)
    for prompt, vision, group in zip(token_ids, visions, groups, strict=True):
        for sample in group:
            if sample.token_ids:
                _, expected = _forward_log_probs(model.double(), prompt, vision, sample, 0.8)
                assert (torch.tensor(sample.log_probs) - expected).abs().max() < 1e-4
