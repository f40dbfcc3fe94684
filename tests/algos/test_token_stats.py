"""`rllib_grpo.algos.token_stats.chunked_token_stats` against the unchunked formulas.

* In float64 the chunked values and gradients (over logits, and fused with an LM head)
  equal `logprobs_from_logits` / `entropy_from_logits` under autograd, to bounds of a few
  float64 roundings of the terms each entry sums (tests/conftest.py).
* In float32 over the same logits: within the float32 log-softmax bound.
* Both hold whatever kernels ATen picks (``ATEN_CPU_CAPABILITY`` = avx2, avx512, default).
* Under bf16 compute (the LM head in bf16) the fused values stay within one bf16 rounding
  of the logits from the unchunked ones.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from rllib_grpo.algos import entropy_from_logits, logprobs_from_logits
from rllib_grpo.algos.token_stats import chunked_token_stats
from tests.conftest import EPS32, EPS64, REPO_ROOT, float32_log_softmax_bound

BF16_EPS = 2.0 ** -7  # torch.finfo(torch.bfloat16).eps: one ulp, relative


def _inputs(dtype: torch.dtype, n: int = 37, hidden: int = 16, vocab: int = 301, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, dtype=torch.float64).to(dtype)
    w = (torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) / 2).to(dtype)
    labels = torch.randint(0, vocab, (n,), generator=gen)
    g_lp = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    g_ent = torch.randn(n, generator=gen, dtype=torch.float64).to(dtype)
    return h, w, labels, g_lp, g_ent


def _reference(h, w, labels, temperature, g_lp, g_ent):
    """Unchunked: the logits, their log-softmax and entropy under autograd."""
    h, w = h.clone().requires_grad_(), w.clone().requires_grad_()
    z = (h @ w.t()) / temperature
    log_probs, entropy = logprobs_from_logits(z, labels, None), entropy_from_logits(z)
    grads = torch.autograd.grad((log_probs * g_lp).sum() + (entropy * g_ent).sum(), (h, w))
    return log_probs.detach(), entropy.detach(), grads, z.detach()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 8, 1000])
@pytest.mark.parametrize("fused", [False, True], ids=["logits", "fused"])
def test_chunked_equals_unchunked_in_float64(temperature, chunk, fused):
    h, w, labels, g_lp, g_ent = _inputs(torch.float64)
    ref_lp, ref_ent, (ref_gh, ref_gw), z = _reference(h, w, labels, temperature, g_lp, g_ent)
    hh, ww = h.clone().requires_grad_(), w.clone().requires_grad_()
    logits = hh @ ww.t()
    inputs = hh if fused else logits
    lp, ent = chunked_token_stats(inputs, labels, temperature, weight=ww if fused else None,
                                  with_entropy=True, chunk_size=chunk)
    gh, gw = torch.autograd.grad((lp * g_lp).sum() + (ent * g_ent).sum(), (hh, ww))
    vocab, hidden = w.shape
    # A logit is a sum of `hidden` products: two evaluations differ by <= hidden·eps·Σ|h·w|
    # (the fused head multiplies by chunks); log-softmax is 2-Lipschitz, the entropy
    # 2·max|z|-Lipschitz in the max norm, and each output's own rounding adds a few eps of
    # its scale (the entropy sums V terms: V·eps).
    logit_err = hidden * EPS64 * ((h.abs() @ w.abs().t()).max().item() / temperature)
    z_scale = z.abs().max().item()
    lp_bound = 2 * logit_err + 8 * EPS64 * max(z_scale, ref_lp.abs().max().item())
    ent_bound = 2 * max(1.0, z_scale) * logit_err + vocab * EPS64 * max(z_scale, 1.0)
    assert (lp - ref_lp).abs().max() <= lp_bound
    assert (ent - ref_ent).abs().max() <= ent_bound
    # d/dz per entry: a few operations on p, log p, H, the incoming gradients (<= 16 eps of
    # its scale, and the z error above times its 1 + 2·|z| Lipschitz constant); then
    # d/dh = dz @ W sums V terms, d/dw = dzᵀ @ h sums N terms.
    probs = torch.softmax(z, -1)
    dz_scale = (g_lp.abs()[:, None] * (1 + probs) + g_ent.abs()[:, None] * probs
                * ((z - torch.logsumexp(z, -1, keepdim=True)).abs() + ref_ent[:, None]))
    dz_err = (16 * EPS64 + 4 * (1 + 2 * z_scale) * logit_err) * dz_scale / temperature
    gh_bound = (vocab * EPS64 * (dz_scale / temperature) + dz_err) @ w.abs()
    gw_bound = (len(labels) * EPS64 * (dz_scale / temperature) + dz_err).t() @ h.abs()
    assert ((gh - ref_gh).abs() <= gh_bound).all()
    assert ((gw - ref_gw).abs() <= gw_bound).all()


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_over_float32_logits_within_the_log_softmax_bound(temperature):
    h, w, labels, _, _ = _inputs(torch.float64)
    logits64 = (h @ w.t()) * 4  # logits up to ~30
    logits = logits64.float()
    ref_lp = logprobs_from_logits(logits / temperature, labels, None)
    ref_ent = entropy_from_logits(logits / temperature)
    lp, ent = chunked_token_stats(logits, labels, temperature, with_entropy=True, chunk_size=5)
    assert lp.dtype == ent.dtype == torch.float32
    z = (logits64 / temperature).abs().max().item()
    bound = float32_log_softmax_bound(z, ref_lp.abs().max().item())
    assert (lp - ref_lp).abs().max() <= bound
    assert (ent - ref_ent).abs().max() <= bound + w.shape[0] * EPS32 * max(z, 1.0)


def test_bf16_head_within_one_bf16_rounding_of_the_logits():
    """The fused head under bf16 compute (inputs and weight in bf16, statistics in fp32)
    against the unchunked bf16 logits: a logit rounds to bf16 at most one ulp (2^-7 of it)
    the other way (another blocking of the matmul), log-softmax is 2-Lipschitz."""
    h, w, labels, _, _ = _inputs(torch.float32)
    hb, wb = h.bfloat16(), w.bfloat16()
    ref_z = (hb @ wb.t()).float() / 0.7
    ref_lp = logprobs_from_logits(ref_z, labels, None)
    lp, ent = chunked_token_stats(hb, labels, 0.7, weight=wb, with_entropy=True, chunk_size=4)
    assert lp.dtype == torch.float32
    z = ref_z.abs().max().item()
    bound = 2 * BF16_EPS * z + float32_log_softmax_bound(z, ref_lp.abs().max().item())
    assert (lp - ref_lp).abs().max() <= bound
    assert (ent - entropy_from_logits(ref_z)).abs().max() <= 2 * z * BF16_EPS * z + \
        w.shape[0] * EPS32 * max(z, 1.0)


def test_gradient_only_where_asked():
    h, w, labels, _, _ = _inputs(torch.float64, n=6)
    w.requires_grad_()
    lp, ent = chunked_token_stats(h, labels, weight=w, with_entropy=False)
    assert ent is None
    (grad_w,) = torch.autograd.grad(lp.sum(), (w,))
    assert grad_w.shape == w.shape
    with pytest.raises(ValueError, match="labels"):
        chunked_token_stats(h, labels[:3])


@pytest.mark.slow
@pytest.mark.parametrize("capability", ["avx2", "avx512", "default"])
def test_equalities_hold_whatever_kernels_aten_picks(capability):
    """The tests above in a fresh process with ``ATEN_CPU_CAPABILITY`` set."""
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__,
         "-k", "not whatever_kernels"], cwd=REPO_ROOT, env=env, capture_output=True,
        text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
