"""Shared-prompt packing (`rllib_grpo.models.shared_prefix`) against padded rows.

* The log-probs and entropies of responses sharing one copy of their prompt are the padded
  ones (float64 models, the bound of `test_packing._log_probs_bound`), for llama and qwen2,
  with groups split across units and rows, an empty response and a lone prompt.
* The gradients are the padded ones (float64, GRAD_REL64): the prompt's hidden states
  collect what each response's copy would have.
* The check can fail: a response that may see another response of its group moves.
* The layout computes fewer token slots than the unshared packing; where the attention takes
  no custom mask, or no prompt repeats, nothing is shared.
"""

from __future__ import annotations

import pytest
import torch

from tests.conftest import GRAD_REL64
from tests.helpers.tiny_lms import (
    grouped_batch,
    log_probs_bound,
    padded_batch,
    shared_log_probs,
    tiny_lm,
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("capacity", [64, 14], ids=["one-unit-per-group", "split-groups"])
@pytest.mark.parametrize("token_stats", ["full", "chunked", "fused"])
def test_shared_prompt_log_probs_equal_padded(arch, capacity, token_stats):
    from rllib_grpo.models.shared_prefix import pack_shared_prompts
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm, batch = tiny_lm(arch, "sdpa", torch.float64), grouped_batch()
    padded = response_log_probs(lm, batch, 0.7, with_entropy=True)
    shared = shared_log_probs(lm, batch, 0.7, capacity, token_stats)
    mask = batch["response_mask"].bool()
    bound = log_probs_bound(lm, batch, 0.7, padded)
    for key in ("log_probs", "entropy"):
        assert (shared[key] - padded[key])[mask].abs().max() <= bound
        assert (shared[key][~mask] == 0).all()
    layout = pack_shared_prompts(batch, capacity=capacity)
    prompt_len = batch["prompt_mask"].sum(-1)
    unshared = int((prompt_len + batch["response_mask"].sum(-1))[mask.any(-1)].sum())
    assert layout.num_real_tokens < unshared
    if capacity == 64:  # one prompt copy per group that has a response
        assert layout.num_real_tokens == int(batch["response_mask"].sum()) + 6 + int(
            prompt_len[4]) + int(prompt_len[7])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_shared_prompt_gradients_equal_padded(arch, float64_rms_norm):
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm, batch = tiny_lm(arch, "sdpa", torch.float64), grouped_batch(seed=1)
    weights = torch.linspace(-1.0, 1.0, batch["response_mask"].numel(), dtype=torch.float64)
    weights = weights.view_as(batch["response_mask"])

    def grads(log_probs):
        lm.zero_grad()
        (log_probs.double() * weights * batch["response_mask"]).sum().backward()
        return [p.grad.clone() for p in lm.parameters()]

    padded = grads(response_log_probs(lm, batch, 1.0)["log_probs"])
    shared = grads(shared_log_probs(lm, batch, 1.0, capacity=14)["log_probs"])
    largest = max(g.abs().max().item() for g in padded)
    assert largest > 0
    assert max((a - b).abs().max().item() for a, b in zip(padded, shared, strict=True)) \
        <= GRAD_REL64 * largest


def test_responses_that_see_each_other_change_the_log_probs():
    """The equality above can fail: with a plain causal mask over the unit, the second
    response of a group attends to the first, and its log-probs move."""
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.models.shared_prefix import pack_shared_prompts

    lm, batch = tiny_lm("llama", "sdpa", torch.float64), grouped_batch()
    right = shared_log_probs(lm, batch, 1.0, 64)["log_probs"]
    layout = pack_shared_prompts(batch, capacity=64)
    length = layout.attention_mask.shape[-1]
    layout.attention_mask = layout.attention_mask | torch.tril(
        torch.ones(length, length, dtype=torch.bool))
    wrong = packed_response_log_probs(lm, batch, 1.0, layout=layout)["log_probs"]
    assert (right - wrong).abs().max() > 1e-3


def test_nothing_is_shared_without_a_dense_mask_or_a_repeated_prompt():
    from rllib_grpo.models.shared_prefix import shared_prefix_layout

    grouped = grouped_batch()
    assert shared_prefix_layout(tiny_lm("llama", "sdpa"), grouped) is not None
    assert shared_prefix_layout(tiny_lm("llama", "eager"), grouped) is None
    distinct = padded_batch()  # random prompts, none repeated
    assert shared_prefix_layout(tiny_lm("llama", "sdpa"), distinct) is None


def test_the_learner_module_shares_prompts_when_asked():
    from rllib_grpo.rllib.learner import module as module_lib

    calls = []
    real = module_lib.shared_prefix_layout

    def spy(lm, batch):
        calls.append(batch["prompt_ids"].shape[0])
        return real(lm, batch)

    lm, batch = tiny_lm("llama", "sdpa", torch.float64), grouped_batch()
    module_lib.shared_prefix_layout, saved = spy, module_lib.shared_prefix_layout
    try:
        module_lib.response_log_probs(lm, batch, 1.0, packed=True)
        assert calls == []
        module_lib.response_log_probs(lm, batch, 1.0, packed=True, share_prompts=True)
        assert calls == [8]
    finally:
        module_lib.shared_prefix_layout = saved
