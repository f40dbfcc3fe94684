"""One update of one learner against two (FSDP2 or DDP), on float64 models: the settings,
the batch, and the checks with their bounds (tests/conftest.py derives them).

Used by tests/rllib/learner/test_fsdp.py, test_ddp.py, test_fsdp_mixed_precision.py and
tests/models/test_export.py; `fixed_batch` by the learner tests that need a hand-made batch.
"""

from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

from tests.conftest import (
    EPS64,
    GRAD_REL64,
    adam_step_bound,
    float32_sum_bound,
    learner_to_float64,
    tiny_config,
)


def fixed_batch(vocab: int, pad: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    n, p_len, r_len = 8, 5, 4
    prompt_lengths = [5, 3, 5, 4, 2, 5, 3, 4]
    response_lengths = [4, 1, 3, 0, 4, 2, 4, 3]  # includes an empty response
    prompt_ids = np.full((n, p_len), pad, np.int64)
    prompt_mask = np.zeros((n, p_len), np.int64)
    response_ids = np.full((n, r_len), pad, np.int64)
    response_mask = np.zeros((n, r_len), np.float32)
    for i, (pl, rl) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
        prompt_ids[i, p_len - pl:] = rng.integers(4, vocab, pl)
        prompt_mask[i, p_len - pl:] = 1
        response_ids[i, :rl] = rng.integers(4, vocab, rl)
        response_mask[i, :rl] = 1
    return {
        "prompt_ids": prompt_ids, "prompt_mask": prompt_mask,
        "response_ids": response_ids, "response_mask": response_mask,
        "rollout_log_probs": np.zeros((n, r_len), np.float32),
        "scores": np.array([1, 0, 0, 1, 0, 0, 0, 1], np.float32),
        "group_index": np.array([0, 0, 0, 0, 1, 1, 1, 1], np.int64),
    }


# The gradient *scale* is checked through the grad norm (clipping and Adam's first step
# are scale-free).
TRAINING = dict(prompts_per_step=4, group_size=2, max_prompt_length=5, max_response_length=4,
                lr=1e-4, weight_decay=0.0, use_kl_loss=True, kl_loss_coef=0.1,
                entropy_coeff=0.01, temperature=0.7)
CASES = {
    "token-mean/fixed": dict(loss_agg_mode="token-mean", micro_batch_size_per_learner=2),
    # Two optimizer steps: each learner's k-th mini-batch is its half of the global k-th.
    "seq-norm/fixed/2-minibatches": dict(loss_agg_mode="seq-mean-token-sum-norm",
                                         micro_batch_size_per_learner=1,
                                         prompts_per_minibatch=2),
    # 13 tokens: the learners need 2 and 3 micro-batches; both run 3.
    "token-mean/token-budget": dict(loss_agg_mode="token-mean", use_dynamic_bsz=True,
                                    max_tokens_per_micro_batch=13),
    "seq-norm/token-budget": dict(loss_agg_mode="seq-mean-token-sum-norm",
                                  use_dynamic_bsz=True, max_tokens_per_micro_batch=13),
    # Batch-wide estimators (verl whitens / counts over the whole batch): the learners'
    # statistics are all-reduced, so two shards give the one-learner advantages.
    "reinforce_plus_plus": dict(adv_estimator="reinforce_plus_plus",
                                micro_batch_size_per_learner=2),
    "reinforce_plus_plus_baseline": dict(adv_estimator="reinforce_plus_plus_baseline",
                                         micro_batch_size_per_learner=2),
    "gpg": dict(adv_estimator="gpg", micro_batch_size_per_learner=2),
}


# FSDP2 all-gathers and reduce-scatters in the parameters' own dtype: float64 once cast.
FLOAT64 = dict(fsdp_param_dtype="model", fsdp_reduce_dtype="model")


def learner_config(num_learners: int, **training):
    config = tiny_config(**{**TRAINING, **training})
    if num_learners:
        # Two cores: one per learner, none for the driver; the env runner stays local.
        config.learners(num_learners=num_learners, num_cpus_per_learner=1)
        config.resources(num_cpus_for_main_process=0)
    return config


def update_batch(vocab: int):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    columns = fixed_batch(vocab, pad=0)
    columns["group_index"] = np.repeat(np.arange(4), 2)  # 4 prompts x 2 responses
    columns["scores"] = np.array([1, 0, 0, 1, 1, 0, 1, 1], np.float32)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=8)


def full_grads(learner) -> dict[str, torch.Tensor]:
    """Full gradients of the policy LM (collective on sharded learners)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from torch.distributed.tensor import DTensor

    lm = learner.module[DEFAULT_MODULE_ID].unwrapped().lm
    return {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu()
            for name, p in lm.named_parameters()}


def max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def max_abs(a: dict) -> float:
    return max(v.abs().max().item() for v in a.values())


def logged(results: list[dict], key: str) -> float:
    from ray.rllib.core import DEFAULT_MODULE_ID

    value = results[0][DEFAULT_MODULE_ID][key]
    return float(value.peek() if hasattr(value, "peek") else value)


def policy_weights(group) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return group.get_weights()[DEFAULT_MODULE_ID]


def float64_scores_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from rllib_grpo.algos import scores_to_tokens

    return scores_to_tokens(scores.double(), mask.double())


def learner_and_advantages_to_float64(learner) -> None:
    """Float64 weights (`learner_to_float64`) and advantages.  The learner takes the scores
    as float32 (``scores.float()``), and batch-wide estimators (reinforce_plus_plus) whiten
    them with sums over the learners, which two learners add in another order: float32
    rounding would decide (measured: gradients 6e-9 apart).  Patches the learner module of
    this process: run in the (remote) learners' own processes."""
    from rllib_grpo.rllib.learner import advantage_step

    learner_to_float64(learner)
    advantage_step.scores_to_tokens = float64_scores_to_tokens


@contextlib.contextmanager
def configured(group, num_learners: int, settings: dict):
    """Run with other loss/batching settings on the same learners.

    They are read from the learner's config at every update, so swapping the
    config object spares a learner restart per case.
    """
    def use(config) -> None:
        group.config = config
        unfrozen = config.copy(copy_frozen=False)
        group.foreach_learner(lambda learner: setattr(learner, "config", unfrozen))

    config = learner_config(num_learners, **FLOAT64, **settings)
    config.validate()
    old = group.config
    use(config)
    try:
        yield
    finally:
        use(old)


def reset(group, weights: dict[str, torch.Tensor]) -> None:
    """Set the policy weights and forget Adam's moments (a fresh optimizer)."""
    group.set_weights({"default_policy": weights})

    def clear(learner):
        for optim in learner._named_optimizers.values():
            optim.state.clear()

    group.foreach_learner(clear)


def perturbed(initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy moved off the reference (the same way every time): old != ref and the
    KL has a gradient."""
    gen = torch.Generator().manual_seed(0)
    start = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in initial.items()}
    start["lm_head.weight"] = start["model.embed_tokens.weight"]  # tied embeddings
    return start


def assert_same_grads_and_norm(grads_a: dict, grads_b: dict, norm_a: float,
                                norm_b: float) -> None:
    """Float64 gradients (clipped) of one update computed two ways, and the norms before
    clipping.  The gradients agree to float64 rounding (`GRAD_REL64` of the largest;
    clipping scales both alike).  So do the unclipped ones, hence their norms differ by
    <= ||dg||_2 <= sqrt(N)·GRAD_REL64·max|g| <= sqrt(N)·GRAD_REL64·||g||, plus the
    norm's own float64 sum of N squares (<= N·eps64 of the norm, to first order)."""
    assert next(iter(grads_a.values())).dtype == torch.float64
    assert max_diff(grads_a, grads_b) <= GRAD_REL64 * max_abs(grads_b)
    n = sum(g.numel() for g in grads_b.values())
    assert abs(norm_a - norm_b) <= (n ** 0.5 * GRAD_REL64 + n * EPS64) * norm_b


def assert_same_weights(a: dict, b: dict, start: dict, grads: dict, optimizer,
                         steps: int) -> None:
    """Weights after ``steps`` AdamW steps from ``start`` whose gradients agree to
    `GRAD_REL64`: apart by at most what Adam makes of that (`adam_step_bound`)."""
    assert max_diff(a, start) > 1e-5  # the update did move the weights
    bound = adam_step_bound(GRAD_REL64 * max_abs(grads), optimizer, max_abs(start), steps)
    assert max_diff(a, b) <= bound


def assert_same_update(one, two, case: str, initial: dict[str, torch.Tensor]) -> None:
    """One update of ``one`` (1 learner) and ``two`` (2 learners) from the same weights."""
    start = perturbed(initial)
    reset(one, start)
    reset(two, start)
    assert max_diff(policy_weights(two), start) == 0.0  # full state in, full state out

    batch = update_batch(vocab=len(start["model.embed_tokens.weight"]))
    with configured(one, 0, CASES[case]), configured(two, 2, CASES[case]):
        results_one, results_two = one.update(batch=batch), two.update(batch=batch)
        norm_one = logged(results_one, "actor/grad_norm")
        norm_two = logged(results_two, "actor/grad_norm")
    # verl's actor/entropy is aggregated over the whole batch, not averaged per learner:
    # a float32 sum (float32 log-probs) of non-negative terms (so Σ|terms| is the value)
    # over the 8 x 4 response slots, the micro-batches (<= 8) and the 2 learners.
    entropy = logged(results_one, "actor/entropy")
    assert logged(results_two, "actor/entropy") == pytest.approx(
        entropy, abs=float32_sum_bound(8 * 4 + 8 + 2, entropy))

    grads_one = full_grads(one._learner)
    grads_two = two._get_results(two.foreach_learner(full_grads))[0]
    # The norm before clipping: a wrong gradient scale (e.g. no x dp_size) shows only here,
    # as clipping and Adam's first step are both scale-free.
    assert_same_grads_and_norm(grads_two, grads_one, norm_two, norm_one)
    minibatches = TRAINING["prompts_per_step"] // CASES[case].get(
        "prompts_per_minibatch", TRAINING["prompts_per_step"])
    optimizer = next(iter(one._learner._named_optimizers.values()))
    assert_same_weights(policy_weights(one), policy_weights(two), start, grads_one, optimizer,
                         steps=minibatches)


def float64_learner_group(config, spaces: dict):
    """A learner group whose modules are built in float64 (see the module docstring).
    Not cast afterwards: RLlib's DDP wrapper sizes its gradient buckets in the parameters'
    dtype when it is built, and would reduce float64 gradients in float32 buckets."""
    spec = config.get_multi_rl_module_spec(spaces=spaces)
    for module_spec in spec.rl_module_specs.values():
        module_spec.model_config = {**module_spec.model_config, "dtype": torch.float64,
                                    "master_weights_dtype": torch.float64}
    return config.build_learner_group(spaces=spaces, rl_module_spec=spec)
