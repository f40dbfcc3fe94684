"""Policy losses (hand values, gradients, metrics) and the log-prob / entropy helpers."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_grpo.algos import (
    POLICY_LOSSES,
    entropy_from_logits,
    logprobs_from_logits,
    policy_loss,
)

LN = math.log

# ---------------------------------------------------------------------------- vanilla
# One row, clip 0.2, clip_ratio_c 3:
#  t0: A=+1, ratio 1   : L1=-1,   L2=-1,   Lc=-1                    -> L=-1   (unclipped)
#  t1: A=+1, ratio 1.5 : L1=-1.5, L2=-1.2, Lc=-1.2 (L2>L1: clipped)  -> L=-1.2
#  t2: A=-1, ratio 0.5 : L1=0.5,  L2=0.8,  Lc=0.8 (clipped); L3=3    -> L=min(3, .8)=0.8
#  t3: A=-1, ratio 4   : L1=4,    L2=1.2,  Lc=4;  L3=3 (dual clip)   -> L=min(3, 4)=3
#  t4: padding (ratio 4, A=+1) -> ignored
# token-mean = (-1 - 1.2 + 0.8 + 3) / 4 = 0.4
# pg_clipfrac = 2/4 (t1, t2); pg_clipfrac_lower = 1/4 (t3)
# ppo_kl = mean(old - new) = -(0 + ln1.5 + ln0.5 + ln4) / 4 = -ln3 / 4
RATIOS = [1.0, 1.5, 0.5, 4.0, 4.0]
ADV = torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0]], dtype=torch.float64)
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
OLD = torch.tensor([[-1.0, -2.0, -0.5, -3.0, -1.0]], dtype=torch.float64)


def _log_prob(old=OLD, ratios=RATIOS):
    new = old + torch.tensor([[LN(r) for r in ratios]], dtype=torch.float64)
    return new.clone().requires_grad_(True)


def _run(name, log_prob, old=OLD, adv=ADV, mask=MASK, **kwargs):
    return policy_loss(
        name, old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask, **kwargs
    )


def test_vanilla_hand_values_and_metrics():
    log_prob = _log_prob()
    loss, metrics = _run("vanilla", log_prob)
    assert loss.item() == pytest.approx(0.4)
    assert metrics == {
        "actor/pg_clipfrac": pytest.approx(0.5),
        "actor/ppo_kl": pytest.approx(-LN(3) / 4),
        "actor/pg_clipfrac_lower": pytest.approx(0.25),
    }
    assert all(type(v) is float for v in metrics.values())
    loss.backward()
    # only t0 is unclipped: d(-A·ratio)/dlogp = -A·ratio = -1, / 4 tokens; clipped and
    # dual-clipped tokens are constant in logp
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[-0.25, 0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    )


def test_vanilla_asymmetric_clip():
    # clip_ratio_high 0.6: t1 ratio 1.5 < 1.6 is no longer clipped -> L=-1.5
    # loss = (-1 - 1.5 + 0.8 + 3) / 4 = 0.325; clipfrac = 1/4 (t2 only)
    loss, metrics = _run("vanilla", _log_prob(), clip_ratio_low=0.2, clip_ratio_high=0.6)
    assert loss.item() == pytest.approx(0.325)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.25)
    # clip_ratio 0.6 sets both bounds: range [0.4, 1.6] clips neither t1 (1.5 -> L=-1.5) nor
    # t2 (0.5 -> L=0.5); t3 stays dual-clipped at 3 -> (-1 - 1.5 + 0.5 + 3) / 4 = 0.25
    loss, metrics = _run("vanilla", _log_prob(), clip_ratio=0.6)
    assert loss.item() == pytest.approx(0.25)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_vanilla_dual_clip_bound():
    # clip_ratio_c 10: t3 L = min(10, 4) = 4 -> (-1 - 1.2 + 0.8 + 4) / 4 = 0.65, no activation
    loss, metrics = _run("vanilla", _log_prob(), clip_ratio_c=10.0)
    assert loss.item() == pytest.approx(0.65)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    for bad in (1.0, 0.5):
        with pytest.raises(ValueError, match="clip_ratio_c"):
            _run("vanilla", _log_prob(), clip_ratio_c=bad)


def test_vanilla_log_ratio_clamp():
    # log ratio 50 is clamped to 20 before exp; A=-1 -> dual clip gives L3 = 3
    log_prob = (OLD[:, :1] + 50.0).requires_grad_(True)
    loss, metrics = _run("vanilla", log_prob, old=OLD[:, :1], adv=-ADV[:, :1], mask=MASK[:, :1])
    assert loss.item() == 3.0
    assert metrics["actor/ppo_kl"] == -20.0  # masked_mean(-clamped log ratio)


def test_rollout_is_weights_and_agg_kwargs():
    # weights [2, 1, 1, 0.5, 9]: [-2, -1.2, 0.8, 1.5] -> -0.9 / 4 = -0.225
    weights = torch.tensor([[2.0, 1.0, 1.0, 0.5, 9.0]], dtype=torch.float64)
    loss, _ = _run("vanilla", _log_prob(), rollout_is_weights=weights)
    assert loss.item() == pytest.approx(-0.225)
    # global normalisation: 1.6 / 8 tokens · dp 2 = 0.4;  token-sum: 1.6
    loss, _ = _run("vanilla", _log_prob(), dp_size=2, global_num_tokens=8)
    assert loss.item() == pytest.approx(0.4)
    loss, _ = _run("vanilla", _log_prob(), loss_agg_mode="token-sum")
    assert loss.item() == pytest.approx(1.6)
    with pytest.raises(ValueError, match="global_num_tokens"):
        _run("vanilla", _log_prob(), dp_size=2)


# ------------------------------------------------------------------------------- gspo
# row 0: log ratios [0.1, 0.3], A=+1 -> log s = 0.2, s = e^0.2 = 1.2214 > 1.2 -> clipped:
#        L = max(-1.2214, -1.2) = -1.2 on both tokens (gradient 0)
# row 1: log ratios [-0.1, 0.1, 0.0], A=-1 -> log s = 0, s = 1 -> L = 1 on three tokens
# seq-mean-token-mean = (-1.2 + 1) / 2 = -0.1   (token-mean would be (-2.4 + 3) / 5 = 0.12)
# gradient on row 1: dL/dlogp = -A·s = 1 per token, · (1/3 tokens) · (1/2 seqs) = 1/6
GSPO_OLD = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
GSPO_LOG_RATIO = torch.tensor([[0.1, 0.3, 99.0], [-0.1, 0.1, 0.0]], dtype=torch.float64)
GSPO_MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
GSPO_ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)


def test_gspo_hand_values():
    log_prob = (GSPO_OLD + GSPO_LOG_RATIO).requires_grad_(True)
    loss, metrics = _run(
        "gspo", log_prob, old=GSPO_OLD, adv=GSPO_ADV, mask=GSPO_MASK, loss_agg_mode="token-mean"
    )
    assert loss.item() == pytest.approx(-0.1)  # forced seq-mean-token-mean
    # clipfrac: row 0's two tokens of 5; ppo_kl = -(0.1 + 0.3 - 0.1 + 0.1 + 0) / 5 = -0.08
    assert metrics == {
        "actor/pg_clipfrac": pytest.approx(0.4),
        "actor/ppo_kl": pytest.approx(-0.08),
        "actor/pg_clipfrac_lower": 0.0,
    }
    loss.backward()
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[0.0, 0.0, 0.0], [1 / 6, 1 / 6, 1 / 6]], dtype=torch.float64)
    )


def test_gspo_clamps_log_sequence_ratio_at_10():
    # log s = 15 -> clamped to 10; A=-1: max(e^10, 1.2) = e^10; the clamp stops the gradient
    old = torch.zeros(1, 1, dtype=torch.float64)
    log_prob = torch.full((1, 1), 15.0, dtype=torch.float64, requires_grad=True)
    loss, _ = _run("gspo", log_prob, old=old, adv=-torch.ones(1, 1), mask=torch.ones(1, 1))
    assert loss.item() == pytest.approx(math.exp(10))
    loss.backward()
    assert log_prob.grad.item() == 0.0


# ------------------------------------------------------------------------------ cispo


def test_cispo_hand_values():
    # L = -sg(clip(ratio, 0.8, 1.2))·A·logp
    #  t0: ratio 1,   logp -1,   A=+1: -1·1·(-1)      = 1
    #  t1: ratio 1.5 (clip 1.2), logp -2, A=+1: -1.2·1·(-2) = 2.4
    #  t2: ratio 0.5 (clip 0.8), logp -0.5, A=-2: -0.8·(-2)·(-0.5) = -0.8
    # token-mean = 2.6 / 3; clipfrac = 2/3; grads = -sg(clip)·A / 3 = [-1, -1.2, 1.6] / 3
    new = torch.tensor([[-1.0, -2.0, -0.5]], dtype=torch.float64)
    old = new - torch.tensor([[LN(1.0), LN(1.5), LN(0.5)]], dtype=torch.float64)
    log_prob = new.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -2.0]], dtype=torch.float64)
    loss, metrics = _run("cispo", log_prob, old=old, adv=adv, mask=torch.ones(1, 3))
    assert loss.item() == pytest.approx(2.6 / 3)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(2 / 3)
    assert metrics["actor/pg_clipfrac_lower"] == 0.0
    loss.backward()
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[-1.0, -1.2, 1.6]], dtype=torch.float64) / 3
    )


# -------------------------------------------------------------------------------- gpg


def test_gpg_hand_values():
    # L = -logp·A: logp [-1, -2], A [1, -1] -> [1, -2] -> token-mean -0.5; grad -A/2
    log_prob = torch.tensor([[-1.0, -2.0]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, -1.0]], dtype=torch.float64)
    loss, metrics = _run("gpg", log_prob, old=log_prob.detach(), adv=adv, mask=torch.ones(1, 2))
    assert loss.item() == pytest.approx(-0.5)
    assert metrics == {}
    loss.backward()
    torch.testing.assert_close(log_prob.grad, torch.tensor([[-0.5, 0.5]], dtype=torch.float64))


# ------------------------------------------------------------------------------- sapo


def test_sapo_hand_values():
    # ratio 1 everywhere, so gate = sigmoid(0)·4/tau = 2/tau
    # row 0 (1 token, A=+1, tau_pos 1):     L = -2
    # row 1 (2 tokens, A=-1, tau_neg 1.05): L = +2/1.05 each
    # seq-mean-token-mean = (-2 + 2/1.05) / 2
    # dgate/dratio = tau·sigmoid'(0)·4/tau = 1 and dratio/dlogp = 1, so dL/dlogp = -A:
    # row 0: -1 · (1/1)/2 = -0.5;  row 1: +1 · (1/2)/2 = 0.25
    old = torch.full((2, 2), -1.0, dtype=torch.float64)
    log_prob = old.clone().requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
    loss, metrics = _run("sapo", log_prob, old=old, adv=adv, mask=mask)
    assert loss.item() == pytest.approx((-2 + 2 / 1.05) / 2)
    assert metrics == {
        "actor/pg_clipfrac": 0.0,
        "actor/ppo_kl": 0.0,
        "actor/pg_clipfrac_lower": 0.0,
    }
    loss.backward()
    torch.testing.assert_close(
        log_prob.grad, torch.tensor([[-0.5, 0.0], [0.25, 0.25]], dtype=torch.float64)
    )
    # tau_pos 2: row 0 gate 4/2·0.5 = 1 -> L = -1 -> (-1 + 2/1.05) / 2
    loss, _ = _run("sapo", old.clone(), old=old, adv=adv, mask=mask, tau_pos=2.0)
    assert loss.item() == pytest.approx((-1 + 2 / 1.05) / 2)


# ------------------------------------------------------------------------- contracts


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_rollout_is_weights_scale_every_loss(name):
    log_prob = _log_prob()
    base, _ = _run(name, log_prob)
    doubled, _ = _run(name, log_prob, rollout_is_weights=torch.full_like(ADV, 2.0))
    assert doubled.item() == pytest.approx(2 * base.item())


@pytest.mark.parametrize("name", sorted(POLICY_LOSSES.names()))
def test_empty_micro_batch_is_zero_with_finite_grads(name):
    log_prob = _log_prob()
    loss, metrics = _run(name, log_prob, mask=torch.zeros_like(MASK))
    assert loss.item() == 0.0
    assert all(v == 0.0 for v in metrics.values())
    loss.backward()
    assert torch.all(log_prob.grad == 0)


def test_bad_names_and_kwargs():
    with pytest.raises(ValueError, match="Known: cispo, gpg, gspo, sapo, vanilla"):
        _run("ppo", _log_prob())
    with pytest.raises(TypeError, match="clip_ratio_cc"):
        _run("vanilla", _log_prob(), clip_ratio_cc=3.0)


# --------------------------------------------------------------- log-probs, entropy


def test_logprobs_and_entropy_hand_values():
    # softmax([ln .5, ln .25, ln .25]) = [.5, .25, .25]
    logits = torch.tensor([[LN(0.5), LN(0.25), LN(0.25)]], dtype=torch.float64)
    lp = logprobs_from_logits(logits, torch.tensor([0]))
    torch.testing.assert_close(lp, torch.tensor([LN(0.5)], dtype=torch.float64))
    lp = logprobs_from_logits(logits + 7.0, torch.tensor([2]))  # shift-invariant
    torch.testing.assert_close(lp, torch.tensor([LN(0.25)], dtype=torch.float64))
    # H = .5 ln 2 + 2 · .25 ln 4 = 1.5 ln 2
    torch.testing.assert_close(
        entropy_from_logits(logits), torch.tensor([1.5 * LN(2)], dtype=torch.float64)
    )
    # uniform over 4 -> ln 4
    torch.testing.assert_close(entropy_from_logits(torch.zeros(2, 4)), torch.full((2,), LN(4)))


def test_logprobs_chunked_matches_log_softmax_with_grads():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 5), generator=gen)
    ref_leaf = logits.clone().requires_grad_(True)
    ref = torch.log_softmax(ref_leaf, -1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref.sum().backward()
    for chunk in (None, 1, 4, 1000):
        leaf = logits.clone().requires_grad_(True)
        got = logprobs_from_logits(leaf, labels, chunk_size=chunk)
        assert got.shape == (3, 5)
        torch.testing.assert_close(got, ref.detach())
        got.sum().backward()
        torch.testing.assert_close(leaf.grad, ref_leaf.grad)
        torch.testing.assert_close(
            entropy_from_logits(logits, chunk_size=chunk),
            -(torch.softmax(logits, -1) * torch.log_softmax(logits, -1)).sum(-1),
        )


def test_logprobs_low_precision_upcasts():
    logits = torch.randn(2, 3, 7).to(torch.bfloat16)
    labels = torch.zeros(2, 3, dtype=torch.long)
    assert logprobs_from_logits(logits, labels).dtype == torch.float32
    assert entropy_from_logits(logits).dtype == torch.float32
    with pytest.raises(ValueError, match="labels shape"):
        logprobs_from_logits(logits, labels[:, :2])
