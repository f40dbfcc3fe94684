"""``token_stats`` (`rllib_grpo.models.lm_head`): which heads are fused, and the learner's
log-probs / entropies the same in every mode, padded or packed.

* A plain llama / qwen2 head is fused; a peft-wrapped model, an FSDP2 module, a head with
  a bias or a model type with logit scaling (gemma's soft-capping) is not ('auto' falls
  back to 'chunked', 'fused' is refused by name).
* On float64 models every mode gives the full mode's values (the statistics in float32, as
  the full mode rounds every logit to float32) within the float32 log-softmax bound, and
  the policy gradients of a loss agree to float32 rounding of the logits' gradients.
* Under bf16 autocast the fused head stays within one bf16 rounding of the logits.
"""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.models.lm_head import fused_head, token_stats_mode
from tests.conftest import EPS32, float32_log_softmax_bound
from tests.helpers.tiny_lms import padded_batch, tiny_lm

BF16_EPS = 2.0 ** -7


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_plain_heads_are_fused(arch):
    lm = tiny_lm(arch, "sdpa")
    decoder, weight = fused_head(lm)
    assert decoder is lm.model and weight is lm.lm_head.weight
    assert token_stats_mode(lm, "auto") == "fused"


def test_heads_that_are_not_exactly_a_matmul_are_not_fused():
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    lora = get_peft_model(tiny_lm("llama", "sdpa"), LoraConfig(r=2, target_modules=["q_proj"]))
    biased = tiny_lm("llama", "sdpa")
    biased.lm_head = torch.nn.Linear(64, 50, bias=True)
    config = AutoConfig.for_model("gemma2", vocab_size=50, hidden_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                  intermediate_size=128)
    softcapped = AutoModelForCausalLM.from_config(config)
    for lm in (lora, biased, softcapped):
        assert fused_head(lm) is None
        assert token_stats_mode(lm, "auto") == "chunked"
        with pytest.raises(ValueError, match="token_stats='fused'"):
            token_stats_mode(lm, "fused")
    with pytest.raises(ValueError, match="expected one of"):
        token_stats_mode(biased, "fast")


def _loss_and_grads(lm, batch, packed, mode):
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm.zero_grad(set_to_none=True)
    out = response_log_probs(lm, batch, 0.7, with_entropy=True, packed=packed, token_stats=mode)
    mask = batch["response_mask"]
    weights = torch.linspace(-1, 1, mask.numel()).view(mask.shape)
    ((out["log_probs"] * weights * mask).sum() + 0.1 * (out["entropy"] * mask).sum()).backward()
    return out, {name: p.grad.clone() for name, p in lm.named_parameters()}


@pytest.mark.parametrize("packed", [True, False], ids=["packed", "padded"])
@pytest.mark.parametrize("mode", ["fused", "chunked", "auto"])
def test_every_mode_gives_the_full_modes_values_and_gradients(packed, mode):
    lm, batch = tiny_lm("llama", "sdpa", torch.float64), padded_batch()
    if mode == "fused" and not packed:
        mode = "auto"  # padded rows chunk the model's logits
    full, full_grads = _loss_and_grads(lm, batch, packed, "full")
    out, grads = _loss_and_grads(lm, batch, packed, mode)
    mask = batch["response_mask"].bool()
    for key in ("log_probs", "entropy"):
        assert out[key].dtype == torch.float32
        assert (out[key][~mask] == 0).all() if packed else True
    z = 2.0  # max|logit / T| of this model and batch (test_packing asserts <= 2)
    bound = float32_log_softmax_bound(z, full["log_probs"][mask].abs().max().item())
    assert (out["log_probs"] - full["log_probs"])[mask].abs().max() <= bound
    assert (out["entropy"] - full["entropy"])[mask].abs().max() <= bound + 50 * EPS32 * z
    # The logits' gradients are float32 in both (statistics in float32), computed by other
    # formulas: each entry <= 4 float32 roundings of its scale apart; the float64 backward
    # below them is linear and adds nothing comparable, so a parameter's gradient moves by
    # <= 4·eps32 of Σ|terms|, allowed up to 16x its largest entry (cancellation, as
    # GRAD_REL64 allows 40x): 64·eps32 of the largest entry.  Measured: <= 0.9 eps32.
    for name, grad in grads.items():
        scale = full_grads[name].abs().max().item()
        assert (grad - full_grads[name]).abs().max().item() <= 64 * EPS32 * scale, name


def test_bf16_autocast_fused_within_one_bf16_rounding_of_the_full_logits():
    """The product's bf16 path on CPU: fp32 master weights, bf16 autocast; the fused head
    casts the hidden states and the head to bf16 as autocast does for ``lm_head``."""
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm, batch = tiny_lm("llama", "sdpa"), padded_batch()
    mask = batch["response_mask"].bool()
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        full = response_log_probs(lm, batch, 0.7, with_entropy=True, packed=True)
        fused = response_log_probs(lm, batch, 0.7, with_entropy=True, packed=True,
                                   token_stats="fused")
    z = 2.0 * (1 + BF16_EPS)
    bound = 2 * BF16_EPS * z + float32_log_softmax_bound(z, full["log_probs"][mask].abs().max())
    assert fused["log_probs"].dtype == torch.float32
    assert (fused["log_probs"] - full["log_probs"])[mask].abs().max() <= bound
    assert (fused["entropy"] - full["entropy"])[mask].abs().max() <= 2 * z * bound + 50 * EPS32 * z
