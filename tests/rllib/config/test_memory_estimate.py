"""The memory estimate of `explain` against hand computations, and the memory levers' plumbing."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config

# builtin:tiny: hidden 64, 2 layers, 2 heads of 32, 1 KV head, MLP 128, vocab 18 (char tokenizer).
H, L, KV_HEADS, HEAD_DIM, VOCAB = 64, 2, 1, 32, 18


@pytest.fixture(scope="module")
def num_params() -> int:
    from rllib_grpo.models import load_causal_lm, resolve_model

    return sum(p.numel() for p in load_causal_lm(resolve_model("builtin:tiny")).parameters())


def _estimate(config):
    from rllib_grpo.rllib.config.memory import estimate_memory

    return estimate_memory(config)


def test_tiny_model_matches_a_hand_computation(num_params):
    est = _estimate(tiny_config())  # fp32, KL loss, 1 learner, 16 trajectories of 16 + 4 tokens
    assert est.shape.num_params == num_params
    assert (est.shape.hidden_size, est.shape.num_layers, est.shape.vocab_size) == (H, L, VOCAB)
    tokens = 16 * (16 + 4)
    assert est.learner == {
        "weights": 4 * num_params, "gradients": 4 * num_params,
        "optimizer (AdamW)": 2 * 4 * num_params, "reference model": 4 * num_params,
        "activations": tokens * H * L * 17 * 4, "logits (fp32)": tokens * VOCAB * 4,
    }
    assert est.sampler == {"weights": 4 * num_params,
                           "KV cache": 16 * 20 * L * 2 * KV_HEADS * HEAD_DIM * 4}


def test_lora_lowers_gradients_and_optimizer_and_drops_the_reference(num_params):
    full, lora = _estimate(tiny_config()), _estimate(tiny_config(lora_rank=8))
    # rank x (in + out) over q, k, v, o, gate, up, down of both layers.
    per_layer = (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128)
    assert lora.shape.lora_params == 8 * per_layer * L
    assert lora.learner["optimizer (AdamW)"] == 2 * 4 * lora.shape.lora_params
    assert lora.learner["optimizer (AdamW)"] < full.learner["optimizer (AdamW)"] / 4
    assert lora.learner["gradients"] < full.learner["gradients"] / 4
    assert lora.learner["reference model"] == 0
    assert lora.learner["weights"] == 4 * (num_params + lora.shape.lora_params)


def test_two_learners_halve_the_sharded_part():
    one = _estimate(tiny_config())
    two = _estimate(tiny_config().learners(num_learners=2))
    for row in ("weights", "gradients", "optimizer (AdamW)", "reference model"):
        assert two.learner[row] == one.learner[row] / 2, row
    ddp = _estimate(tiny_config(fsdp=False).learners(num_learners=2))
    assert ddp.learner["weights"] == one.learner["weights"]  # DDP: a full replica each


def test_levers_lower_their_rows():
    base = _estimate(tiny_config())
    checkpointed = _estimate(tiny_config(gradient_checkpointing=True))
    assert checkpointed.learner["activations"] == 320 * H * (L + 17) * 4
    offloaded = _estimate(tiny_config(ref_param_offload=True))
    assert offloaded.learner["reference model"] == 0
    budget = _estimate(tiny_config(use_dynamic_bsz=True, max_tokens_per_micro_batch=64))
    assert budget.learner["logits (fp32)"] == 64 * VOCAB * 4
    assert base.learner_total > checkpointed.learner_total


def test_explain_prints_the_table_or_why_not():
    text = tiny_config().explain()
    assert "memory estimate: 0.0752M params (2 layers x 64 hidden, vocab 18), float32" in text
    assert "optimizer (AdamW)" in text and "KV cache" in text
    assert "memory estimate: unavailable" in tiny_config(
        model_path="nobody/no-such-model-here").explain()


def test_sampler_memory_fraction_sets_vllms_gpu_memory_utilization():
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    config = tiny_config(sampler="vllm", sampler_memory_fraction=0.4,
                         sampler_config={"gpu_memory_utilization": 0.2})
    assert engine_options(config)["gpu_memory_utilization"] == 0.4
    assert "gpu_memory_utilization" not in engine_options(
        tiny_config(sampler="hf", sampler_memory_fraction=0.4))


def test_optimizer_offload_hooks_keep_the_step_exact():
    from rllib_grpo.models.offload import offload_optimizer_states

    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 4)) for _ in range(2)]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    opt, twin_opt = torch.optim.AdamW(params, lr=0.1), torch.optim.AdamW(twins, lr=0.1)
    assert len(offload_optimizer_states(opt)) == 2
    for _ in range(3):
        for group, optim in ((params, opt), (twins, twin_opt)):
            for p in group:
                p.grad = torch.ones_like(p)
            optim.step()
    assert all(torch.equal(a, b) for a, b in zip(params, twins, strict=True))
    assert all(s["exp_avg"].device.type == "cpu" for s in opt.state.values())


def test_learner_installs_optimizer_offload_hooks():
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from tests.conftest import tiny_config

    learner = tiny_config(optimizer_offload=True).build_learner(
        spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    (optimizer,) = list(learner._optimizer_parameters)
    assert optimizer._optimizer_step_pre_hooks and optimizer._optimizer_step_post_hooks
