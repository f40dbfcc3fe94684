"""The transformers sampler: group shapes, EOS, seeds, log-probs against a forward pass, weights."""

from __future__ import annotations

import dataclasses
import logging
import string
import subprocess
import sys

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import Sampler, SamplingParams, make_sampler
from rllib_grpo.samplers.hf import HFSampler
from tests.conftest import float32_log_softmax_bound
from tests.helpers.log_probs import max_log_prob_diff, mean_log_prob

# More than 50 tokens: transformers' hidden top_k=50 default would show in the log-probs.
ALPHABET = string.printable[:80]
EOS = 1


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    cache = tmp_path_factory.mktemp("models")
    return resolve_model("builtin:tiny", cache_dir=cache, builder_kwargs={"alphabet": ALPHABET})


@pytest.fixture(scope="module")
def prompts():
    tokenizer = build_char_tokenizer(ALPHABET)
    return [tokenizer.encode(text) for text in ("3+4=", "12*5=", "7-")]


@pytest.fixture()
def sampler(model_path):
    return HFSampler(model_path, dtype="float32", seed=0)


def test_groups_have_n_samples_with_consistent_fields(sampler, prompts):
    groups = sampler.generate(prompts, 4, SamplingParams(temperature=1.0, max_tokens=24))
    assert isinstance(sampler, Sampler)
    assert [len(group) for group in groups] == [4, 4, 4]
    samples = [sample for group in groups for sample in group]
    for sample in samples:
        assert 1 <= len(sample.token_ids) == len(sample.log_probs) <= 24
        assert all(lp <= 0 and lp > -float("inf") for lp in sample.log_probs)
        assert (EOS in sample.token_ids) == (sample.finish_reason == "stop")
        if sample.finish_reason == "stop":
            assert sample.token_ids.index(EOS) == len(sample.token_ids) - 1  # EOS kept, last
        else:
            assert len(sample.token_ids) == 24


def test_stop_token_ids_end_samples(sampler, prompts):
    every_token = list(range(len(ALPHABET) + 4))
    params = SamplingParams(max_tokens=8, stop_token_ids=every_token)
    for group in sampler.generate(prompts, 2, params):
        assert [(len(s.token_ids), s.finish_reason) for s in group] == [(1, "stop")] * 2


def test_same_seed_same_samples(model_path, sampler, prompts):
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=7)
    first = sampler.generate(prompts, 3, params)
    assert sampler.generate(prompts, 3, params) == first
    assert sampler.generate(prompts, 3, SamplingParams(max_tokens=12, seed=8)) != first
    # Unseeded calls follow the sampler's seed: a fresh sampler repeats them.
    unseeded = [sampler.generate(prompts, 3, SamplingParams(max_tokens=12)) for _ in range(2)]
    assert unseeded[0] != unseeded[1]
    fresh = HFSampler(model_path, seed=0)
    assert [fresh.generate(prompts, 3, SamplingParams(max_tokens=12)) for _ in range(2)] == unseeded


def test_request_seeds_seed_the_call_and_leave_the_stream(sampler, prompts):
    """Multi-turn episodes pass their own seeds: one batched call is seeded from all of them."""
    params = SamplingParams(max_tokens=12)
    calls = sampler.seeds.calls
    first = sampler.generate(prompts, 1, params, seeds=[1, 2, 3])
    assert sampler.generate(prompts, 1, params, seeds=[1, 2, 3]) == first
    assert sampler.generate(prompts, 1, params, seeds=[1, 2, 4]) != first
    assert sampler.seeds.calls == calls


def _log_prob_bound(model, prompts, groups, params) -> float:
    """The sampler (generate, with a KV cache) and one forward pass of the same float64
    weights: float64 logits equal to ~1e-15, rounded to float32 for the log-softmax on both
    sides (`float32_log_softmax_bound`).  In float32 they were 1-4 ulps apart (<= 9.5e-7)."""
    temperature = params.temperature if params.temperature > 0 else 1.0
    logit_scale, value_scale = 0.0, 0.0
    for prompt, group in zip(prompts, groups, strict=True):
        for sample in group:
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([[*prompt, *sample.token_ids]])).logits
            logit_scale = max(logit_scale, logits.abs().max().item() / temperature)
            value_scale = max([value_scale, *(abs(lp) for lp in sample.log_probs)])
    return float32_log_softmax_bound(logit_scale, value_scale)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=1.0, max_tokens=16),
        SamplingParams(temperature=0.7, max_tokens=16),
        SamplingParams(temperature=0.7, top_k=5, top_p=0.9, max_tokens=16),
        SamplingParams(temperature=0.0, max_tokens=16),
    ],
    ids=["t1", "t0.7", "topk-topp", "greedy"],
)
def test_log_probs_equal_a_forward_pass(model_path, sampler, prompts, params):
    sampler.model.double()  # float64 (tests/conftest.py); the Parameters stay the same
    groups = sampler.generate(prompts, 4, params)
    assert params.temperature == 0 or mean_log_prob(groups) < -0.5
    model = load_causal_lm(model_path).double()
    assert max_log_prob_diff(model, prompts, groups, params) <= _log_prob_bound(
        model, prompts, groups, params)


@pytest.mark.parametrize("params", [SamplingParams(temperature=0.0),
                                    SamplingParams(temperature=0.7, top_k=5, top_p=0.9)],
                         ids=["greedy", "sampled"])
def test_generation_config_is_valid_so_transformers_warns_about_nothing(sampler, params):
    """transformers warns "generation flags are not valid" for sampling options on a
    greedy config; strict validation raises on the same issues."""
    sampler._generation_config(params, {0}).validate(strict=True)


def test_greedy_samples_agree(sampler, prompts):
    for group in sampler.generate(prompts, 3, SamplingParams(temperature=0.0, max_tokens=10)):
        assert group[0].token_ids == group[1].token_ids == group[2].token_ids
        # Rows of one batch may differ in the last float bit.
        torch.testing.assert_close(group[0].log_probs, group[2].log_probs)


def test_load_weights_changes_samples_and_rejects_wrong_keys(model_path, sampler, prompts):
    sampler.model.double()  # float64: the float32 weights below are cast into it
    params = SamplingParams(temperature=0.8, max_tokens=16, seed=3)
    before = sampler.generate(prompts, 4, params)
    model = load_causal_lm(model_path)
    # The head is tied: it moves with the embeddings.  Noise at the init scale
    # (std 0.02) keeps the distribution spread, so the comparison below means something.
    with torch.no_grad():
        model.model.embed_tokens.weight.add_(0.02 * torch.randn_like(model.lm_head.weight))
    perturbed = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    stats = sampler.load_weights(perturbed)
    assert stats["bytes"] == sum(v.numel() * 4 for v in perturbed.values())
    assert stats["seconds"] >= 0
    after = sampler.generate(prompts, 4, params)
    assert after != before
    assert mean_log_prob(after) < -0.5
    model.double()
    assert max_log_prob_diff(model, prompts, after, params) <= _log_prob_bound(
        model, prompts, after, params)
    wrong = {k: v for k, v in perturbed.items() if k != "model.norm.weight"}
    wrong["bogus"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\].*unexpected \['bogus'\]"):
        sampler.load_weights(wrong)


def test_make_sampler_falls_back_to_transformers_with_one_warning(model_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # "import vllm" now raises ImportError
    with caplog.at_level(logging.WARNING, logger="rllib_grpo.samplers"):
        sampler = make_sampler("auto", model_path=model_path, gpu_memory_utilization=0.3)
    assert isinstance(sampler, HFSampler)
    assert [r.getMessage() for r in caplog.records if "vLLM" in r.getMessage()] != []
    assert len(caplog.records) == 1
    with pytest.raises(ImportError):
        make_sampler("vllm", model_path=model_path)
    with pytest.raises(ValueError, match="sampler kind"):
        make_sampler("sglang", model_path=model_path)


def test_importing_samplers_imports_neither_vllm_nor_transformers():
    code = (
        "import sys, rllib_grpo.samplers; "
        "print(sorted(m for m in ('vllm', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0, max_tokens=12),
                                    SamplingParams(temperature=0.7, top_k=5, top_p=0.9,
                                                   max_tokens=12),
                                    SamplingParams(temperature=0.0, max_tokens=12)],
                         ids=["t1", "topk-topp", "greedy"])
def test_log_probs_are_those_of_every_steps_full_scores(model_path, sampler, prompts, params):
    """The per-step gather gives bit for bit what ``output_scores=True`` with transformers'
    own warpers gave (the samples too, for one seed)."""
    from transformers import GenerationConfig

    from rllib_grpo.samplers.hf import _left_padded

    rows = [list(p) for p in prompts for _ in range(3)]
    stop_ids = sampler.eos_token_ids
    sampling = params.temperature > 0
    reference_config = GenerationConfig(
        do_sample=sampling, temperature=params.temperature if sampling else None,
        top_p=params.top_p if sampling else None,
        top_k=(params.top_k if params.top_k > 0 else 0) if sampling else None,
        max_new_tokens=params.max_tokens, eos_token_id=sorted(stop_ids),
        pad_token_id=sampler.pad_token_id, output_scores=True, return_dict_in_generate=True)
    input_ids, attention_mask = _left_padded(rows, sampler.pad_token_id, sampler.device)
    torch.manual_seed(7)
    out = sampler.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                 generation_config=reference_config)
    new_ids = out.sequences[:, input_ids.shape[1]:]
    expected = torch.stack([s.float().log_softmax(-1).gather(-1, new_ids[:, t, None])[:, 0]
                            for t, s in enumerate(out.scores)], dim=1)
    groups = sampler.generate(prompts, 3, dataclasses.replace(params, seed=7))
    samples = [sample for group in groups for sample in group]
    for sample, ids, log_probs in zip(samples, new_ids.tolist(), expected, strict=True):
        assert sample.token_ids == ids[:len(sample.token_ids)]
        assert sample.log_probs == log_probs[:len(sample.token_ids)].tolist()  # exact


def test_no_step_keeps_its_full_vocabulary_scores(sampler, prompts, monkeypatch):
    """``output_scores`` would keep rows x steps x vocab floats (~10 GB for 128 x 128
    tokens at a 152k vocabulary); the log-probs are gathered step by step instead."""
    calls = []
    generate = sampler.model.generate

    def spy(**kwargs):
        out = generate(**kwargs)
        calls.append((kwargs["generation_config"], out))
        return out

    monkeypatch.setattr(sampler.model, "generate", spy)
    sampler.generate(prompts, 2, SamplingParams(temperature=0.8, max_tokens=8))
    (config, out), = calls
    assert not config.output_scores and not config.output_logits
    assert torch.is_tensor(out)  # the sequences alone, no per-step scores


def test_default_device_is_the_gpu_the_runner_holds(model_path, monkeypatch):
    """No device given: the runner's GPU when it holds one (also behind sampler='auto'
    when vLLM does not import), else the CPU."""
    from rllib_grpo.samplers import hf

    class Placed(Exception):
        pass

    class FakeModel:
        def to(self, device):
            raise Placed(str(device))

    monkeypatch.setattr(hf, "load_causal_lm", lambda *a, **k: FakeModel())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setitem(sys.modules, "vllm", None)  # "import vllm" raises ImportError
    with pytest.raises(Placed, match="cuda:0"):
        make_sampler("auto", model_path=model_path)
    with pytest.raises(Placed, match="^cpu$"):
        HFSampler(model_path, device="cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(Placed, match="^cpu$"):
        HFSampler(model_path)
