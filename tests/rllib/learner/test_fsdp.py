"""FSDP2 learners (2 Ray Train workers, gloo on CPU) against one plain learner.

* One update on the same batch gives the same weights with 2 sharded learners as
  with 1 (the loss is normalised by global counts and FSDP averages gradients
  over ranks, so `dp_size` = world size makes the split invisible), and the same on
  padding-free (packed) rows as on padded ones.
* A checkpoint written by 2 learners restores into 1 (and back) and training goes on;
  sharded DCP files reshard from 2 learners to 1.
* Slow: the same exactness with RLlib's DDP (``fsdp=False``); bf16 compute with CPU
  offload lands near the fp32 update.

The exactness is checked on float64 models (tests/conftest.py): in float32 the weights of
one and two learners differed by up to 2.6e-6 (after two Adam steps) depending on the
CPU's kernels, and Adam can turn float32 noise on a near-zero gradient into a whole step.
"""

from __future__ import annotations

import contextlib
import time

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
from tests.rllib.learner.test_learner_loss import _fixed_batch

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


def _config(num_learners: int, **training):
    config = tiny_config(**{**TRAINING, **training})
    if num_learners:
        # Two cores: one per learner, none for the driver; the env runner stays local.
        config.learners(num_learners=num_learners, num_cpus_per_learner=1)
        config.resources(num_cpus_for_main_process=0)
    return config


def _batch(vocab: int):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    columns = _fixed_batch(vocab, pad=0)
    columns["group_index"] = np.repeat(np.arange(4), 2)  # 4 prompts x 2 responses
    columns["scores"] = np.array([1, 0, 0, 1, 1, 0, 1, 1], np.float32)
    return MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(columns)}, env_steps=8)


def _grads(learner) -> dict[str, torch.Tensor]:
    """Full gradients of the policy LM (collective on sharded learners)."""
    from ray.rllib.core import DEFAULT_MODULE_ID
    from torch.distributed.tensor import DTensor

    lm = learner.module[DEFAULT_MODULE_ID].unwrapped().lm
    return {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).cpu()
            for name, p in lm.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _max_abs(a: dict) -> float:
    return max(v.abs().max().item() for v in a.values())


def _logged(results: list[dict], key: str) -> float:
    from ray.rllib.core import DEFAULT_MODULE_ID

    value = results[0][DEFAULT_MODULE_ID][key]
    return float(value.peek() if hasattr(value, "peek") else value)


def _weights(group) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return group.get_weights()[DEFAULT_MODULE_ID]


def _float64_scores_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    from rllib_grpo.algos import scores_to_tokens

    return scores_to_tokens(scores.double(), mask.double())


def _learner_to_float64(learner) -> None:
    """Float64 weights (`learner_to_float64`) and advantages.  The learner takes the scores
    as float32 (``scores.float()``), and batch-wide estimators (reinforce_plus_plus) whiten
    them with sums over the learners, which two learners add in another order: float32
    rounding would decide (measured: gradients 6e-9 apart).  Patches the learner module of
    this process: run in the (remote) learners' own processes."""
    from rllib_grpo.rllib.learner import advantage_step

    learner_to_float64(learner)
    advantage_step.scores_to_tokens = _float64_scores_to_tokens


@pytest.fixture(scope="module")
def algos(ray_session):
    """A 1-learner and a 2-learner (FSDP2) GRPO and the initial weights, shared by the
    tests of this file: Ray learner start-up (10-30 s on two cores) dominates here.
    Float64 (see the module docstring), cast before any forward: FSDP2 takes its
    parameters' dtype at its lazy initialisation (the first forward)."""
    from rllib_grpo.rllib.learner import advantage_step

    one = _config(0, **FLOAT64).build_algo()
    two = _config(2, **FLOAT64).build_algo()
    with pytest.MonkeyPatch.context() as patch:  # the local learner: this process
        learner_to_float64(one.learner_group._learner)
        patch.setattr(advantage_step, "scores_to_tokens", _float64_scores_to_tokens)
        two.learner_group._get_results(two.learner_group.foreach_learner(_learner_to_float64))
        yield one, two, _weights(one.learner_group)
    two.stop()
    one.stop()


@contextlib.contextmanager
def _configured(group, num_learners: int, settings: dict):
    """Run with other loss/batching settings on the same learners.

    They are read from the learner's config at every update, so swapping the
    config object spares a learner restart per case.
    """
    def use(config) -> None:
        group.config = config
        unfrozen = config.copy(copy_frozen=False)
        group.foreach_learner(lambda learner: setattr(learner, "config", unfrozen))

    config = _config(num_learners, **FLOAT64, **settings)
    config.validate()
    old = group.config
    use(config)
    try:
        yield
    finally:
        use(old)


def _reset(group, weights: dict[str, torch.Tensor]) -> None:
    """Set the policy weights and forget Adam's moments (a fresh optimizer)."""
    group.set_weights({"default_policy": weights})

    def clear(learner):
        for optim in learner._named_optimizers.values():
            optim.state.clear()

    group.foreach_learner(clear)


def _perturbed(initial: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy moved off the reference (the same way every time): old != ref and the
    KL has a gradient."""
    gen = torch.Generator().manual_seed(0)
    start = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in initial.items()}
    start["lm_head.weight"] = start["model.embed_tokens.weight"]  # tied embeddings
    return start


def _assert_same_grads_and_norm(grads_a: dict, grads_b: dict, norm_a: float,
                                norm_b: float) -> None:
    """Float64 gradients (clipped) of one update computed two ways, and the norms before
    clipping.  The gradients agree to float64 rounding (`GRAD_REL64` of the largest;
    clipping scales both alike).  So do the unclipped ones, hence their norms differ by
    <= ||dg||_2 <= sqrt(N)·GRAD_REL64·max|g| <= sqrt(N)·GRAD_REL64·||g||, plus the
    norm's own float64 sum of N squares (<= N·eps64 of the norm, to first order)."""
    assert next(iter(grads_a.values())).dtype == torch.float64
    assert _max_diff(grads_a, grads_b) <= GRAD_REL64 * _max_abs(grads_b)
    n = sum(g.numel() for g in grads_b.values())
    assert abs(norm_a - norm_b) <= (n ** 0.5 * GRAD_REL64 + n * EPS64) * norm_b


def _assert_same_weights(a: dict, b: dict, start: dict, grads: dict, optimizer,
                         steps: int) -> None:
    """Weights after ``steps`` AdamW steps from ``start`` whose gradients agree to
    `GRAD_REL64`: apart by at most what Adam makes of that (`adam_step_bound`)."""
    assert _max_diff(a, start) > 1e-5  # the update did move the weights
    bound = adam_step_bound(GRAD_REL64 * _max_abs(grads), optimizer, _max_abs(start), steps)
    assert _max_diff(a, b) <= bound


def _assert_same_update(one, two, case: str, initial: dict[str, torch.Tensor]) -> None:
    """One update of ``one`` (1 learner) and ``two`` (2 learners) from the same weights."""
    start = _perturbed(initial)
    _reset(one, start)
    _reset(two, start)
    assert _max_diff(_weights(two), start) == 0.0  # full state in, full state out

    batch = _batch(vocab=len(start["model.embed_tokens.weight"]))
    with _configured(one, 0, CASES[case]), _configured(two, 2, CASES[case]):
        results_one, results_two = one.update(batch=batch), two.update(batch=batch)
        norm_one = _logged(results_one, "actor/grad_norm")
        norm_two = _logged(results_two, "actor/grad_norm")
    # verl's actor/entropy is aggregated over the whole batch, not averaged per learner:
    # a float32 sum (float32 log-probs) of non-negative terms (so Σ|terms| is the value)
    # over the 8 x 4 response slots, the micro-batches (<= 8) and the 2 learners.
    entropy = _logged(results_one, "actor/entropy")
    assert _logged(results_two, "actor/entropy") == pytest.approx(
        entropy, abs=float32_sum_bound(8 * 4 + 8 + 2, entropy))

    grads_one = _grads(one._learner)
    grads_two = two._get_results(two.foreach_learner(_grads))[0]
    # The norm before clipping: a wrong gradient scale (e.g. no x dp_size) shows only here,
    # as clipping and Adam's first step are both scale-free.
    _assert_same_grads_and_norm(grads_two, grads_one, norm_two, norm_one)
    minibatches = TRAINING["prompts_per_step"] // CASES[case].get(
        "prompts_per_minibatch", TRAINING["prompts_per_step"])
    optimizer = next(iter(one._learner._named_optimizers.values()))
    _assert_same_weights(_weights(one), _weights(two), start, grads_one, optimizer,
                         steps=minibatches)


@pytest.mark.parametrize("case", list(CASES))
def test_two_fsdp_learners_match_one_learner(algos, case):
    from rllib_grpo.rllib.learner.fsdp import FSDPGRPOLearner
    from rllib_grpo.rllib.learner.learner_group import GRPOLearnerGroup

    one, two, initial = algos
    assert isinstance(two.learner_group, GRPOLearnerGroup)
    assert all(two.learner_group._get_results(two.learner_group.foreach_learner(
        lambda learner: isinstance(learner, FSDPGRPOLearner)
        and type(learner.module["default_policy"].lm).__name__.startswith("FSDP"))))
    _assert_same_update(one.learner_group, two.learner_group, case, initial)


PACKED_CASES = {"seq-norm/one-row-micro-batches": dict(loss_agg_mode="seq-mean-token-sum-norm",
                                                      micro_batch_size_per_learner=1),
                "token-mean/token-budget": CASES["token-mean/token-budget"]}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_two_fsdp_learners_packed_equal_padded(algos, case):
    """Padding-free rows under FSDP2: one update equals the padded one.  With micro-batches
    of one row, one learner has a micro-batch with no response token (row 3), whose
    zero-weight backward must still take part in the gradient reduce-scatter."""
    one, two, initial = algos
    group, start = two.learner_group, _perturbed(initial)
    batch = _batch(vocab=len(start["model.embed_tokens.weight"]))
    runs = {}
    for packed in (False, True):
        _reset(group, start)
        settings = {**PACKED_CASES[case], "use_remove_padding": packed}
        with _configured(group, 2, settings):
            norm = _logged(group.update(batch=batch), "actor/grad_norm")
        runs[packed] = norm, group._get_results(group.foreach_learner(_grads))[0], _weights(group)
    (norm_padded, grads_padded, padded), (norm_packed, grads_packed, packed) = runs.values()
    _assert_same_grads_and_norm(grads_packed, grads_padded, norm_packed, norm_padded)
    optimizer = next(iter(one.learner_group._learner._named_optimizers.values()))  # same lr
    _assert_same_weights(padded, packed, start, grads_padded, optimizer, steps=1)


def _two_cpus_free(ray, timeout_s: float = 30.0) -> bool:
    """Wait for learners shut down just before to hand their CPUs back."""
    deadline = time.monotonic() + timeout_s
    while ray.available_resources().get("CPU", 0) < 2:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.5)
    return True


def _float64_learner_group(config, spaces: dict):
    """A learner group whose modules are built in float64 (see the module docstring).
    Not cast afterwards: RLlib's DDP wrapper sizes its gradient buckets in the parameters'
    dtype when it is built, and would reduce float64 gradients in float32 buckets."""
    spec = config.get_multi_rl_module_spec(spaces=spaces)
    for module_spec in spec.rl_module_specs.values():
        module_spec.model_config = {**module_spec.model_config, "dtype": torch.float64,
                                    "master_weights_dtype": torch.float64}
    return config.build_learner_group(spaces=spaces, rl_module_spec=spec)


@pytest.mark.slow
@pytest.mark.parametrize("precision", [dict(fsdp_param_dtype="bfloat16"),
                                       dict(model_dtype="bfloat16")],  # verl's policy
                         ids=["fsdp_param_dtype", "model_dtype"])
def test_bf16_mixed_precision_and_cpu_offload_run_close_to_fp32(ray_session, precision):
    """bf16 compute (fp32 master weights and reduce) with CPU offload: one update runs
    and lands near the fp32 single learner (bf16 log-probs are good to ~1e-2)."""
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    if not _two_cpus_free(ray_session):
        pytest.skip("the FSDP learners of the `algos` fixture hold both CPUs")
    spaces = {"default_policy": (TEXT_SPACE, TEXT_SPACE)}
    one = _config(0).build_learner_group(spaces=spaces)
    mixed = _config(2, fsdp_cpu_offload=True, **precision).build_learner_group(
        spaces=spaces)
    try:
        start = _weights(one)
        batch = _batch(vocab=len(start["model.embed_tokens.weight"]))
        norm_one = _logged(one.update(batch=batch), "actor/grad_norm")
        norm_mixed = _logged(mixed.update(batch=batch), "actor/grad_norm")
        assert norm_mixed == pytest.approx(norm_one, rel=0.05)
        assert _weights(mixed)["model.embed_tokens.weight"].dtype == torch.float32
        # Adam moves each weight by <= lr = 1e-4: most moves agree in direction.
        moved_one = torch.cat([(w - start[k]).flatten() for k, w in _weights(one).items()])
        moved_mixed = torch.cat([(w - start[k]).flatten() for k, w in _weights(mixed).items()])
        assert torch.nn.functional.cosine_similarity(moved_one, moved_mixed, dim=0) > 0.9
    finally:
        mixed.shutdown()


def _optimizer_state(group) -> dict:
    state = group.get_state(components="learner/optimizer")["learner"]["optimizer"]
    return next(iter(state.values()))["state"]["state"]


def test_checkpoint_of_two_learners_restores_into_one_and_back(algos, tmp_path):
    from ray.rllib.core import DEFAULT_MODULE_ID

    one, two, _ = algos
    two.train()
    path = two.save_to_path(str(tmp_path / "two"))
    saved_weights = _weights(two.learner_group)
    saved_optim = _optimizer_state(two.learner_group)
    assert saved_optim, "Adam moments are in the checkpoint"

    one.restore_from_path(path)
    assert one.training_iteration == two.training_iteration
    assert _max_diff(_weights(one.learner_group), saved_weights) == 0.0
    restored_optim = _optimizer_state(one.learner_group)
    assert restored_optim.keys() == saved_optim.keys()
    for index, moments in saved_optim.items():
        for key, value in moments.items():
            assert np.array_equal(np.asarray(restored_optim[index][key]), np.asarray(value))
    sampler_state = one.env_runner.sampler.model.state_dict()  # synced in its own dtype
    assert all(torch.equal(sampler_state[k], v.to(sampler_state[k].dtype))
               for k, v in saved_weights.items())

    for _ in range(2):
        result = one.train()
    assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["actor/loss"])
    assert _max_diff(_weights(one.learner_group), saved_weights) > 0.0

    # ... and a 1-learner checkpoint loads into the 2 sharded learners.
    two.restore_from_path(one.save_to_path(str(tmp_path / "one")))
    assert _max_diff(_weights(two.learner_group), _weights(one.learner_group)) == 0.0
    result = two.train()
    assert np.isfinite(result["learners"][DEFAULT_MODULE_ID]["actor/loss"])


def test_sharded_dcp_checkpoint_reshards_from_two_learners_to_one(algos, tmp_path):
    from rllib_grpo.rllib.learner.fsdp import load_sharded_checkpoint, save_sharded_checkpoint

    one, two, _ = algos
    two.train()  # Adam moments exist
    path = str(tmp_path / "dcp")
    save_sharded_checkpoint(two.learner_group, path)
    assert sorted(p.name for p in (tmp_path / "dcp").iterdir()) == [
        ".metadata", "__0_0.distcp", "__1_0.distcp"]  # one file of shards per learner

    load_sharded_checkpoint(one.learner_group, path)
    assert _max_diff(_weights(one.learner_group), _weights(two.learner_group)) == 0.0
    saved_optim, loaded_optim = (_optimizer_state(a.learner_group) for a in (two, one))
    assert loaded_optim.keys() == saved_optim.keys()
    for index, moments in saved_optim.items():
        for key, value in moments.items():
            assert np.array_equal(np.asarray(loaded_optim[index][key]), np.asarray(value))


def test_shard_rows_gives_whole_groups_aligned_with_minibatches():
    from rllib_grpo.rllib.learner.learner_group import shard_rows

    groups = np.repeat([0, 1, 2, 3], 2)
    # Mini-batches of 2 groups: learner r takes group r of each -> its k-th local
    # mini-batch is its half of the global k-th.
    assert [r.tolist() for r in shard_rows(groups, 2, 2)] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert [r.tolist() for r in shard_rows(groups, 2, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    # One group per mini-batch cannot be split: contiguous halves of the step.
    assert [r.tolist() for r in shard_rows(groups, 2, 1)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="unequal size"):
        shard_rows(np.array([0, 0, 0, 1]), 2, 2)
