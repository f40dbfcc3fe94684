"""The learner's update equals a hand-built GRPO step written with `rllib_grpo.algos`.

The learner splits the batch into micro-batches and normalises with global
counts; the reference computation uses the whole batch at once.  Equal weights
after the update prove the loss, its aggregation and the optimizer step.  Both run in
float64 (bounds in tests/conftest.py): in float32 Adam turns rounding noise on
near-zero gradients into weight differences of ~1e-4 that depend on the CPU's kernels.
"""

from __future__ import annotations

import copy

import pytest
import torch

from rllib_grpo.algos import scores_to_tokens
from tests.conftest import (
    GRAD_REL64,
    adam_step_bound,
    float32_sum_bound,
    learner_to_float64,
    tiny_config,
)
from tests.helpers.learner_updates import fixed_batch


def _reference_step(lm, ref_lm, batch, c) -> tuple[float, float]:
    """One GRPO step on ``lm`` (in place); the loss and the aggregate of its per-token
    terms' absolute values (the scale of its float32 rounding)."""
    from rllib_grpo.algos import agg_loss, compute_advantage, kl_penalty, policy_loss
    from rllib_grpo.rllib.learner.module import response_log_probs

    t = {k: torch.as_tensor(v) for k, v in batch.items()}
    mask = t["response_mask"]
    with torch.no_grad():
        old = response_log_probs(lm, t, c.temperature)["log_probs"]
        ref = response_log_probs(ref_lm, t, c.temperature)["log_probs"]
    rewards = scores_to_tokens(t["scores"], mask)
    adv, _ = compute_advantage("grpo", rewards, mask, group_ids=batch["group_index"])
    optim = torch.optim.AdamW(lm.parameters(), lr=c.lr, betas=c.betas, weight_decay=c.weight_decay)
    out = response_log_probs(lm, t, c.temperature, with_entropy=True)
    # verl [NEW]: sequence means divide by every response of the mini-batch, empty ones too.
    agg = {"horizon": c.loss_horizon, "global_num_seqs": len(mask)}
    pg, _ = policy_loss("vanilla", old_log_prob=old, log_prob=out["log_probs"], advantages=adv,
                        response_mask=mask, loss_agg_mode=c.loss_agg_mode, **agg)
    kl = agg_loss(kl_penalty(out["log_probs"], ref, c.kl_loss_type), mask, c.loss_agg_mode, **agg)
    ent = agg_loss(out["entropy"], mask, c.loss_agg_mode, **agg)
    loss = pg - c.entropy_coeff * ent + c.kl_loss_coef * kl
    with torch.no_grad():  # vanilla PPO: the per-token term is -A·ratio (unclipped here)
        ratio = torch.exp(out["log_probs"] - old)
        abs_sum = (agg_loss((adv * ratio).abs(), mask, c.loss_agg_mode, **agg)
                   + c.entropy_coeff * agg_loss(out["entropy"].abs(), mask, c.loss_agg_mode, **agg)
                   + c.kl_loss_coef * agg_loss(kl_penalty(out["log_probs"], ref, c.kl_loss_type)
                                               .abs(), mask, c.loss_agg_mode, **agg))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(lm.parameters(), c.grad_clip)
    optim.step()
    return loss.item(), abs_sum.item()


@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-sum-norm",
                                      "seq-mean-token-mean"])
def test_learner_update_matches_hand_built_step(agg_mode):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    c = tiny_config(prompts_per_step=2, group_size=4, micro_batch_size_per_learner=2,
                    use_kl_loss=True, kl_loss_coef=0.1, entropy_coeff=0.01,
                    loss_agg_mode=agg_mode, lr=1e-2, temperature=0.7,
                    grad_clip=1e6)  # no clipping: the gradient's scale must match too
    learner = c.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    module = learner.module[DEFAULT_MODULE_ID]
    learner_to_float64(learner)
    lm = copy.deepcopy(module.lm)
    ref_lm = copy.deepcopy(module.ref_lm)
    vocab = lm.config.vocab_size
    batch = fixed_batch(vocab, pad=0)

    # Perturb the policy so old != ref and the KL has a gradient.
    with torch.no_grad():
        for p_learner, p_copy in zip(module.lm.parameters(), lm.parameters(), strict=True):
            noise = 0.05 * torch.randn_like(p_learner, generator=None)
            p_learner.add_(noise)
            p_copy.add_(noise)

    expected_loss, abs_sum = _reference_step(lm, ref_lm, batch, c)
    results = learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)}, 8))

    pairs = list(zip(module.lm.parameters(), lm.parameters(), strict=True))
    # The (unclipped) gradients agree to float64 rounding ...
    grad_diff = max((a.grad - b.grad).abs().max().item() for a, b in pairs)
    assert grad_diff <= GRAD_REL64 * max(b.grad.abs().max().item() for _, b in pairs)
    # ... and so do the weights, up to what Adam's step makes of that difference.
    weight_scale = max(b.abs().max().item() for _, b in pairs)
    optimizer = next(iter(learner._named_optimizers.values()))
    assert max((a - b).abs().max().item() for a, b in pairs) <= adam_step_bound(
        grad_diff, optimizer, weight_scale)
    # The loss is a float32 sum (float32 log-probs) over the 8 x 4 response slots, the
    # micro-batches (<= 8) and its 3 terms, taken in another order by the learner.
    logged = results[DEFAULT_MODULE_ID]["actor/loss"]
    assert abs(float(getattr(logged, "peek", lambda: logged)()) - expected_loss) <= \
        float32_sum_bound(batch["response_mask"].size + len(batch["response_mask"]) + 3, abs_sum)


def test_offloaded_reference_visits_the_device_once_per_pass(monkeypatch):
    """``ref_param_offload``: the reference pass over 4 micro-batches moves the reference
    in once and out once (it moved per micro-batch), and gives the same log-probs as the
    reference over the whole batch."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.models.offload import HostOffloaded
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.learner.module import response_log_probs

    config = tiny_config(prompts_per_step=2, group_size=4, micro_batch_size_per_learner=2,
                         max_prompt_length=5, max_response_length=4, use_kl_loss=True,
                         ref_param_offload=True)
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    assert module._host_ref is not None and module.ref_lm is None
    moves: list[str] = []
    load, unload = HostOffloaded._load, HostOffloaded._unload

    def spy_load(self, device):
        moves.append("in")
        load(self, device)

    def spy_unload(self):
        moves.append("out")
        unload(self)

    # The learner is on the CPU: treat it as a device the reference must visit.
    monkeypatch.setattr(HostOffloaded, "_stays", staticmethod(lambda device: False))
    monkeypatch.setattr(HostOffloaded, "_load", spy_load)
    monkeypatch.setattr(HostOffloaded, "_unload", spy_unload)
    forwards = []
    reference_log_probs = module.reference_log_probs
    monkeypatch.setattr(module, "reference_log_probs",
                        lambda *a, **kw: forwards.append(1) or reference_log_probs(*a, **kw))
    columns = fixed_batch(module.lm.config.vocab_size, pad=0)
    batch = {k: torch.as_tensor(v) for k, v in columns.items()}
    passes = learner._old_and_reference_log_probs(batch)
    assert len(forwards) == 4 and moves == ["in", "out"]
    with torch.no_grad():
        whole = response_log_probs(module._host_ref.model, batch, module.temperature)
    mask = batch["response_mask"].bool()
    assert torch.allclose(passes["ref_log_probs"][mask], whole["log_probs"][mask], atol=1e-5)


def test_the_learner_steps_with_torchs_fused_adamw_on_cpu():
    """torch's default AdamW on CPU is its for-loop: a SmolLM2-135M step took 1.13 s of CPU
    time, the fused kernel 0.14 s (benchmarks/learner.py)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.learner.learner import adamw_implementation

    learner = tiny_config().build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    (optimizer,) = learner._named_optimizers.values()
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["fused"] is True
    assert adamw_implementation([torch.zeros(2, dtype=torch.long)]) == {}
    assert adamw_implementation([]) == {}
