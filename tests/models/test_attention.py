"""`rllib_grpo.models.attention`: the matmul attention computes what sdpa computes.

Float64 models (llama and qwen2, grouped-query heads), so rounding cannot decide:

* padded rows (left-padded prompts), packed rows (several sequences per row, masks made
  from position ids) and shared-prompt rows (a boolean 4-D mask) give the log-probs and
  entropies of sdpa's padded rows, within `log_probs_bound` (their float32 rounding),
  also where rows longer than `MATMUL_MAX_KV_LEN` go to sdpa (its masks converted);
* the gradients are sdpa's (GRAD_REL64 of the largest);
* cached decoding (the transformers sampler) gives sdpa's logits at every step;
* the check can fail: dropping the mask moves the log-probs;
* the switch happens on CPU at 16 bits for plain-attention architectures only.
"""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.models.attention import (
    MATMUL_ATTENTION,
    prefer_matmul_attention,
    register_matmul_attention,
)
from tests.conftest import EPS64, GRAD_REL64
from tests.helpers.tiny_lms import grouped_batch, log_probs_bound, shared_log_probs, tiny_lm


def _pair(arch: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    register_matmul_attention()
    return tiny_lm(arch, "sdpa", torch.float64), tiny_lm(arch, MATMUL_ATTENTION, torch.float64)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("layout", ["padded", "packed", "shared"])
@pytest.mark.parametrize("max_kv_len", [256, 4], ids=["matmul", "long-rows-to-sdpa"])
def test_log_probs_equal_sdpa_s(arch, layout, max_kv_len, monkeypatch):
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.rllib.learner.module import response_log_probs

    monkeypatch.setattr("rllib_grpo.models.attention.MATMUL_MAX_KV_LEN", max_kv_len)
    sdpa, matmul = _pair(arch)
    batch = grouped_batch()
    reference = response_log_probs(sdpa, batch, 0.7, with_entropy=True)
    if layout == "padded":
        got = response_log_probs(matmul, batch, 0.7, with_entropy=True)
    elif layout == "packed":
        got = packed_response_log_probs(matmul, batch, 0.7, with_entropy=True)
    else:
        got = shared_log_probs(matmul, batch, 0.7, capacity=14)
    mask = batch["response_mask"].bool()
    bound = log_probs_bound(sdpa, batch, 0.7, reference)
    for key in ("log_probs", "entropy"):
        assert (got[key] - reference[key])[mask].abs().max() <= bound


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gradients_equal_sdpa_s(arch, float64_rms_norm):
    from rllib_grpo.rllib.learner.module import response_log_probs

    sdpa, matmul = _pair(arch)
    batch = grouped_batch(seed=1)
    weights = torch.linspace(-1.0, 1.0, batch["response_mask"].numel(), dtype=torch.float64)
    weights = weights.view_as(batch["response_mask"]) * batch["response_mask"]

    def grads(lm, log_probs):
        lm.zero_grad()
        (log_probs.double() * weights).sum().backward()
        return [p.grad.clone() for p in lm.parameters()]

    expected = grads(sdpa, response_log_probs(sdpa, batch, 1.0)["log_probs"])
    got = grads(matmul, shared_log_probs(matmul, batch, 1.0, capacity=14)["log_probs"])
    largest = max(g.abs().max().item() for g in expected)
    assert largest > 0
    assert max((a - b).abs().max().item() for a, b in zip(expected, got, strict=True)) \
        <= GRAD_REL64 * largest


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_cached_decoding_gives_sdpa_s_logits(arch):
    """Left-padded prompts, 6 greedy steps with the KV cache.  Each logit is a sum of a
    few hundred float64 products in either implementation (hidden 64, 2 layers): the two
    are within 64 * eps64 of the largest logit (measured: ~4 eps64)."""
    sdpa, matmul = _pair(arch)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(4, 50, (3, 7), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    mask[2, :5] = 0
    outputs = [lm.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                           max_new_tokens=6, output_logits=True, return_dict_in_generate=True,
                           pad_token_id=0, eos_token_id=None)
               for lm in (sdpa, matmul)]
    assert torch.equal(outputs[0].sequences, outputs[1].sequences)
    expected, got = torch.stack(outputs[0].logits), torch.stack(outputs[1].logits)
    assert (expected - got).abs().max() <= 64 * EPS64 * expected.abs().max()


def test_without_its_mask_the_log_probs_move():
    """The equality above can fail: a mask function that lets every token see every other
    (prompts, padding and later tokens) changes the log-probs."""
    from rllib_grpo.models.attention import matmul_attention
    from rllib_grpo.rllib.learner.module import response_log_probs

    sdpa, matmul = _pair("llama")
    batch = grouped_batch()
    reference = response_log_probs(sdpa, batch, 1.0)["log_probs"]
    from transformers import AttentionInterface

    AttentionInterface.register(MATMUL_ATTENTION, lambda module, q, k, v, mask, **kw:
                                matmul_attention(module, q, k, v, None, **kw))
    try:
        moved = response_log_probs(matmul, batch, 1.0)["log_probs"]
    finally:
        register_matmul_attention()
    mask = batch["response_mask"].bool()
    assert (moved - reference)[mask].abs().max() > 1e-3


def test_the_switch_is_for_cpus_at_16_bits_and_plain_attention_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert prefer_matmul_attention(tiny_lm("qwen2", "sdpa"), cpu, "bfloat16")
    assert prefer_matmul_attention(tiny_lm("llama", "sdpa"), cpu, "float16")
    assert not prefer_matmul_attention(tiny_lm("llama", "sdpa"), cpu, "float32")
    assert not prefer_matmul_attention(tiny_lm("llama", "sdpa"), cuda, "bfloat16")
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model("gemma2", vocab_size=50, hidden_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=128, head_dim=32)
    softcapped = AutoModelForCausalLM.from_config(config)  # attention logit soft-capping
    assert not prefer_matmul_attention(softcapped, cpu, "bfloat16")
    assert softcapped.config._attn_implementation != MATMUL_ATTENTION


def test_the_learner_and_the_transformers_sampler_use_it_in_bf16_on_cpu():
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.models import resolve_model
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.samplers.hf import HFSampler
    from tests.conftest import tiny_config

    for dtype, attention in (("bfloat16", MATMUL_ATTENTION), ("float32", "sdpa")):
        config = tiny_config(model_dtype=dtype, use_kl_loss=True, kl_loss_coef=0.1)
        learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
        module = learner.module[DEFAULT_MODULE_ID].unwrapped()
        assert module.lm.config._attn_implementation == attention
        assert module.ref_lm.config._attn_implementation == attention

    path = resolve_model("builtin:tiny")
    assert HFSampler(path, dtype="bfloat16").model.config._attn_implementation \
        == MATMUL_ATTENTION
    assert HFSampler(path, dtype="float32").model.config._attn_implementation == "sdpa"
