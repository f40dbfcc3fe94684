"""RLlib's DDP learners (``fsdp=False``, 2 Ray Train workers, gloo on CPU): gradients are
accumulated locally over a mini-batch's micro-batches (``no_sync``) and all-reduced once,
on its last micro-batch, and the update still equals one learner's (on float64 models, with
the bounds derived in `tests/helpers/learner_updates.py`).  On a Ray of its own
(`own_ray_session`): the two learners need both CPUs."""

from __future__ import annotations

from tests.helpers.learner_updates import (
    CASES,
    assert_same_update,
    float64_learner_group,
    learner_config,
    policy_weights,
)

# Micro-batches per learner and mini-batch, and mini-batches per step, of each case.
ROUNDS = {"seq-norm/fixed/2-minibatches": (2, 2),  # 1 trajectory per micro-batch
          "token-mean/token-budget": (3, 1)}  # 13 tokens per micro-batch: 3 on both learners


def _count_all_reduces(learner) -> None:
    """DDP's communication hook sees every bucket it all-reduces: record the bucket indices
    (bucket 0 once per all-reduce round), then all-reduce as DDP's default does."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    def hook(buckets: list[int], bucket):
        buckets.append(bucket.index())
        return allreduce_hook(None, bucket)

    learner.all_reduced_buckets = []
    learner.module["default_policy"].register_comm_hook(learner.all_reduced_buckets, hook)


def _all_reduce_rounds(group) -> list[int]:
    rounds = group._get_results(group.foreach_learner(
        lambda learner: learner.all_reduced_buckets.count(0)))
    group.foreach_learner(lambda learner: learner.all_reduced_buckets.clear())
    return rounds


def test_ddp_learners_all_reduce_once_per_minibatch_with_the_same_update(own_ray_session):
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchDDPRLModule

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    spaces = {"default_policy": (TEXT_SPACE, TEXT_SPACE)}
    one = float64_learner_group(learner_config(0), spaces)
    ddp = float64_learner_group(learner_config(2, fsdp=False), spaces)
    try:
        assert all(ddp._get_results(ddp.foreach_learner(
            lambda learner: isinstance(learner.module["default_policy"], TorchDDPRLModule))))
        ddp.foreach_learner(_count_all_reduces)  # before the first backward
        for case, (micro_batches, minibatches) in ROUNDS.items():
            assert_same_update(one, ddp, case, policy_weights(one))
            assert micro_batches > 1 and case in CASES
            # One round per mini-batch on each learner (not one per micro-batch).
            assert _all_reduce_rounds(ddp) == [minibatches, minibatches], case
    finally:
        ddp.shutdown()
