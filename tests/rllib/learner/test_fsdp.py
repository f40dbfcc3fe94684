"""FSDP2 learners (2 Ray Train workers, gloo on CPU) against one plain learner.

* One update on the same batch gives the same weights with 2 sharded learners as
  with 1 (the loss is normalised by global counts and FSDP averages gradients
  over ranks, so `dp_size` = world size makes the split invisible), and the same on
  padding-free (packed) rows as on padded ones.
* A checkpoint written by 2 learners restores into 1 (and back) and training goes on;
  sharded DCP files reshard from 2 learners to 1.

RLlib's DDP (``fsdp=False``): tests/rllib/learner/test_ddp.py; bf16 compute with CPU offload:
test_fsdp_mixed_precision.py (each on a Ray of its own: their learners need both CPUs).

The exactness is checked on float64 models (tests/conftest.py): in float32 the weights of
one and two learners differed by up to 2.6e-6 (after two Adam steps) depending on the
CPU's kernels, and Adam can turn float32 noise on a near-zero gradient into a whole step.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import learner_to_float64
from tests.helpers.learner_updates import (
    CASES,
    FLOAT64,
    assert_same_grads_and_norm,
    assert_same_update,
    assert_same_weights,
    configured,
    float64_scores_to_tokens,
    full_grads,
    learner_and_advantages_to_float64,
    learner_config,
    logged,
    max_diff,
    perturbed,
    policy_weights,
    reset,
    update_batch,
)


@pytest.fixture(scope="module")
def algos(ray_session):
    """A 1-learner and a 2-learner (FSDP2) GRPO and the initial weights, shared by the
    tests of this file: Ray learner start-up (10-30 s on two cores) dominates here.
    Float64 (see the module docstring), cast before any forward: FSDP2 takes its
    parameters' dtype at its lazy initialisation (the first forward)."""
    from rllib_grpo.rllib.learner import advantage_step

    one = learner_config(0, **FLOAT64).build_algo()
    two = learner_config(2, **FLOAT64).build_algo()
    with pytest.MonkeyPatch.context() as patch:  # the local learner: this process
        learner_to_float64(one.learner_group._learner)
        patch.setattr(advantage_step, "scores_to_tokens", float64_scores_to_tokens)
        two.learner_group._get_results(
            two.learner_group.foreach_learner(learner_and_advantages_to_float64))
        yield one, two, policy_weights(one.learner_group)
    two.stop()
    one.stop()


@pytest.mark.parametrize("case", list(CASES))
def test_two_fsdp_learners_match_one_learner(algos, case):
    from rllib_grpo.rllib.learner.fsdp import FSDPGRPOLearner
    from rllib_grpo.rllib.learner.learner_group import GRPOLearnerGroup

    one, two, initial = algos
    assert isinstance(two.learner_group, GRPOLearnerGroup)
    assert all(two.learner_group._get_results(two.learner_group.foreach_learner(
        lambda learner: isinstance(learner, FSDPGRPOLearner)
        and type(learner.module["default_policy"].lm).__name__.startswith("FSDP"))))
    assert_same_update(one.learner_group, two.learner_group, case, initial)


PACKED_CASES = {"seq-norm/one-row-micro-batches": dict(loss_agg_mode="seq-mean-token-sum-norm",
                                                      micro_batch_size_per_learner=1),
                "token-mean/token-budget": CASES["token-mean/token-budget"]}


@pytest.mark.parametrize("case", list(PACKED_CASES))
def test_two_fsdp_learners_packed_equal_padded(algos, case):
    """Padding-free rows under FSDP2: one update equals the padded one.  With micro-batches
    of one row, one learner has a micro-batch with no response token (row 3), whose
    zero-weight backward must still take part in the gradient reduce-scatter."""
    one, two, initial = algos
    group, start = two.learner_group, perturbed(initial)
    batch = update_batch(vocab=len(start["model.embed_tokens.weight"]))
    runs = {}
    for packed in (False, True):
        reset(group, start)
        settings = {**PACKED_CASES[case], "use_remove_padding": packed}
        with configured(group, 2, settings):
            norm = logged(group.update(batch=batch), "actor/grad_norm")
        runs[packed] = norm, group._get_results(group.foreach_learner(full_grads))[0], policy_weights(group)
    (norm_padded, grads_padded, padded), (norm_packed, grads_packed, packed) = runs.values()
    assert_same_grads_and_norm(grads_packed, grads_padded, norm_packed, norm_padded)
    optimizer = next(iter(one.learner_group._learner._named_optimizers.values()))  # same lr
    assert_same_weights(padded, packed, start, grads_padded, optimizer, steps=1)


def _optimizer_state(group) -> dict:
    state = group.get_state(components="learner/optimizer")["learner"]["optimizer"]
    return next(iter(state.values()))["state"]["state"]


def test_checkpoint_of_two_learners_restores_into_one_and_back(algos, tmp_path):
    from ray.rllib.core import DEFAULT_MODULE_ID

    one, two, _ = algos
    two.train()
    path = two.save_to_path(str(tmp_path / "two"))
    saved_weights = policy_weights(two.learner_group)
    saved_optim = _optimizer_state(two.learner_group)
    assert saved_optim, "Adam moments are in the checkpoint"

    one.restore_from_path(path)
    assert one.training_iteration == two.training_iteration
    assert max_diff(policy_weights(one.learner_group), saved_weights) == 0.0
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
    assert max_diff(policy_weights(one.learner_group), saved_weights) > 0.0

    # ... and a 1-learner checkpoint loads into the 2 sharded learners.
    two.restore_from_path(one.save_to_path(str(tmp_path / "one")))
    assert max_diff(policy_weights(two.learner_group), policy_weights(one.learner_group)) == 0.0
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
    assert max_diff(policy_weights(one.learner_group), policy_weights(two.learner_group)) == 0.0
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
