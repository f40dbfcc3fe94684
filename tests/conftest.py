"""Shared fixtures: a small Ray session and GRPO configs on the tiny built-in model."""

from __future__ import annotations

import os
from pathlib import Path

# Two cores shared by torch, Ray workers and vLLM: one thread each is faster and
# far steadier than oversubscribing (sft_warmup went from 0.3 s to 26 s under load).
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

# The ``ray`` marker and the fast tier's guard (`make test-fast`).
from tests.helpers.tiers import pytest_collection_modifyitems, pytest_configure  # noqa: E402, F401

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
# tests/gpu/ holds scripts for GPU machines, run by hand (their docstrings say how): never
# collected, so that none can skip itself into green (tests/test_references.py checks).
collect_ignore = ["gpu"]

# Models built in tests are cached per test session, away from the user's cache.
os.environ.setdefault("RLLIB_GRPO_MODEL_CACHE", os.path.join(
    os.environ.get("PYTEST_CACHE_DIR", "/tmp"), "rllib_grpo_test_models"))


def _start_test_ray():
    """A small Ray of the tests' own (2 CPUs), even when another cluster runs on this machine."""
    import ray

    ray.init(address="local", num_cpus=2, object_store_memory=300 * 1024**2,
             include_dashboard=False, log_to_driver=False, configure_logging=False)
    return ray


@pytest.fixture(scope="session")
def ray_session():
    """The Ray the tests share: started once, shut down at the end of the session."""
    import ray

    if not ray.is_initialized():
        _start_test_ray()
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def own_ray_session():
    """A fresh Ray for one module whose actors need every CPU (two learners on two CPUs), so
    that no other module's actors can hold them.  The shared session, if it was up, is
    started again afterwards for the modules that use `ray_session`."""
    import ray

    shared_was_up = ray.is_initialized()
    ray.shutdown()
    yield _start_test_ray()
    ray.shutdown()
    if shared_was_up:
        _start_test_ray()


def tiny_config(**training):
    """A fast GRPO config: tiny model, transformers sampler, local runner and learner."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    settings = dict(model_path="builtin:tiny", prompts_per_step=4, group_size=4,
                    max_prompt_length=16, max_response_length=4, lr=1e-3, sampler="hf")
    settings.update(training)
    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(**settings)
        .debugging(seed=0)
    )


# ------------------------------------------------------------------ exactness
# Equality claims between two computations (a hand-built step, packed vs padded rows, one
# learner vs two) are checked where rounding cannot decide them: the models in float64,
# with bounds derived below from the dtype and the values' scale.  One float32 stage
# stays: `response_log_probs` rounds the logits to float32 (`.float()`) for log-softmax and
# entropy, so log-probs, losses and logged metrics are float32 even for a float64 model.
# Both computations round float64 logits that agree to ~1e-15 there, so they see the same
# float32 values (a logit rounding the other way is a ~2^-29 event per logit), and the
# gradients w.r.t. the float64 weights differ by float64 rounding only.
EPS32 = 2.0 ** -23  # torch.finfo(torch.float32).eps, 1.19e-7
EPS64 = 2.0 ** -52  # torch.finfo(torch.float64).eps, 2.22e-16
# The gradients of one loss computed two ways in float64 (other batch shapes, micro-batch
# partial sums, other ranks): every entry is a sum over n <= 100 token positions (8 rows x
# <= 13 tokens here) of per-token terms, and two summations of the same n terms differ by
# <= n·eps·Σ|terms| (recursive summation is within (n-1)·eps/2·Σ|terms| of the exact sum,
# Higham, "Accuracy and Stability of Numerical Algorithms", §4.2).  Allowing Σ|terms| up to
# 40x the largest gradient (cancellation): 100 · 40 · eps64 = 4000 · eps64 ≈ 8.9e-13 of the
# largest gradient.  Measured: <= 1 eps64 (2e-16).  A float32 step on one side only would
# show at ~1e-8, a real difference (a loss coefficient, a lost token) at >= 1e-4.
GRAD_REL64 = 4000 * EPS64


def learner_to_float64(learner) -> None:
    """Cast a local learner's policy and reference LMs to float64 in place, before any step.

    ``Module.double()`` swaps each Parameter's data and keeps the Parameter objects, so the
    optimizer (built on them) steps the float64 weights; its state must still be empty
    (Adam's moments are created, in the parameters' dtype, at the first step)."""
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = learner.module[DEFAULT_MODULE_ID].unwrapped()
    for lm in (module.lm, getattr(module, "ref_lm", None)):
        if lm is not None:
            lm.double()
    optimizers = list(learner._named_optimizers.values())
    assert optimizers and all(not optim.state for optim in optimizers)
    params = [p for optim in optimizers for group in optim.param_groups for p in group["params"]]
    assert {id(p) for p in params} == {id(p) for p in module.lm.parameters() if p.requires_grad}
    assert all(p.dtype == torch.float64 for p in params)


def adam_step_bound(grad_diff: float, optimizer, weight_scale: float, steps: int = 1) -> float:
    """Largest weight difference after ``steps`` AdamW steps (float64) from equal weights
    whose gradients differ by at most ``grad_diff`` at every step.

    The first step moves a weight by lr·g/(|g| + ε) (bias-corrected moments m̂ = g, v̂ = g²),
    and d/dg [g/(|g| + ε)] = ε/(|g| + ε)² <= 1/ε: Adam amplifies a gradient difference by up
    to lr/ε on near-zero gradients (1e6 at lr 1e-2, ε 1e-8; why float32 noise of 1e-7 on a
    gradient can move a weight by 1e-4).  Step k moves it by lr·m̂/(√v̂ + ε), m̂ and v̂ means
    of the g_i and g_i² with weights a_i, b_i summing to 1; its derivatives sum to
    <= 1/(√v̂ + ε) + |m̂|·Σ b_i|g_i|/(√v̂(√v̂ + ε)²) <= (1 + 1/(4·sqrt(min b_i)))/ε <= 2/ε
    while min b_i >= 1/16 (k <= 15 at β2 = 0.999).  Differences add up over the steps, and
    each step's own float64 arithmetic (w·(1 - lr·wd) - step) adds a few eps64 of |w| + lr."""
    assert 1 <= steps <= 15
    group = optimizer.param_groups[0]
    lr, eps = group["lr"], group["eps"]
    lipschitz = 1.0 if steps == 1 else 2.0
    return steps * (lipschitz * lr * grad_diff / eps + 4 * EPS64 * (weight_scale + lr))


def float32_log_softmax_bound(logit_scale: float, value_scale: float) -> float:
    """How far the float32 log-probs of two float64 computations can be apart when both
    round their logits (equal to ~1e-15) to float32 for the log-softmax, as the package does
    (``.float()`` in `response_log_probs`, the tests' `forward_log_probs` and the transformers
    sampler).  Where a logit rounds the other way the inputs are <= 2 float32 roundings
    apart (the logit's and its division by T: 2·eps32·Z, Z = ``logit_scale`` = max|logit/T|);
    log-softmax is 2-Lipschitz in the max norm and each output's own rounding may differ by
    2 ulps of ``value_scale`` (max|log p|): <= 4·eps32·Z + 2·eps32·|log p|, under 8 ulps of
    the larger scale.  (A top-k/top-p cut-off that a flipped logit crosses is a different
    matter: a ~2^-29 event per logit.)"""
    return 8 * EPS32 * max(logit_scale, value_scale)


def float32_sum_bound(n_terms: int, abs_sum: float) -> float:
    """Largest difference of two float32 evaluations of a sum of the same ``n_terms`` terms
    in any order or grouping: each is within (n-1)·eps/2·Σ|terms| of the exact sum
    (Higham §4.2, to first order), so they differ by <= n·eps32·Σ|terms|."""
    return n_terms * EPS32 * abs_sum


@pytest.fixture
def float64_rms_norm(monkeypatch):  # tests/models/test_shared_prefix.py
    """transformers' RMSNorm computes in float32 whatever its input (``.to(torch.float32)``):
    a float32 step inside the float64 model.  Forward, every token sees the same float32
    roundings shared or not; backward, a shared prompt position receives the *sum* of its
    responses' gradients and rounds it once to float32, where the copies rounded each part:
    a float32-sized difference (5e-8 of the largest gradient, measured) that is rounding,
    not the layout.  Here the norm stays in its input's dtype for float64 inputs."""
    import torch
    from transformers.models.llama.modeling_llama import LlamaRMSNorm
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RMSNorm

    for norm in (LlamaRMSNorm, Qwen2RMSNorm):
        original = norm.forward

        def forward(self, hidden_states, _original=original):
            if hidden_states.dtype != torch.float64:
                return _original(self, hidden_states)
            variance = hidden_states.pow(2).mean(-1, keepdim=True)
            return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

        monkeypatch.setattr(norm, "forward", forward)


@pytest.fixture
def float64_qwen2_vl(monkeypatch):
    """Qwen2-VL's RMSNorm and vision rotary embedding in their input's dtype for float64
    inputs: like `float64_rms_norm`, transformers computes them in float32 whatever the input
    (tests/models/test_vision.py, tests/samplers/test_vision_samplers.py)."""
    import torch
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl

    norm = qwen2_vl.Qwen2VLRMSNorm.forward

    def forward(self, hidden_states, _original=norm):
        if hidden_states.dtype != torch.float64:
            return _original(self, hidden_states)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    rotary = qwen2_vl.apply_rotary_pos_emb_vision

    def apply_rotary(q, k, cos, sin, _original=rotary):
        if q.dtype != torch.float64:
            return _original(q, k, cos, sin)
        cos, sin = cos.unsqueeze(-2).to(q.dtype), sin.unsqueeze(-2).to(q.dtype)
        return (q * cos + qwen2_vl.rotate_half(q) * sin,
                k * cos + qwen2_vl.rotate_half(k) * sin)

    monkeypatch.setattr(qwen2_vl.Qwen2VLRMSNorm, "forward", forward)
    monkeypatch.setattr(qwen2_vl, "apply_rotary_pos_emb_vision", apply_rotary)
