"""RLlib's DDP learners (``fsdp=False``, 2 Ray Train workers, gloo on CPU): gradients are
accumulated locally over a mini-batch's micro-batches (``no_sync``) and all-reduced once,
on its last micro-batch, and the update still equals one learner's (on float64 models, with
the bounds derived in `tests/rllib/learner/test_fsdp.py`)."""

from __future__ import annotations

import pytest

from tests.rllib.learner.test_fsdp import (
    CASES,
    _assert_same_update,
    _config,
    _float64_learner_group,
    _two_cpus_free,
    _weights,
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


def test_ddp_learners_all_reduce_once_per_minibatch_with_the_same_update(ray_session):
    from ray.rllib.core.rl_module.torch.torch_rl_module import TorchDDPRLModule

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    if not _two_cpus_free(ray_session):
        pytest.skip("other learners still hold both CPUs")
    spaces = {"default_policy": (TEXT_SPACE, TEXT_SPACE)}
    one = _float64_learner_group(_config(0), spaces)
    ddp = _float64_learner_group(_config(2, fsdp=False), spaces)
    try:
        assert all(ddp._get_results(ddp.foreach_learner(
            lambda learner: isinstance(learner.module["default_policy"], TorchDDPRLModule))))
        ddp.foreach_learner(_count_all_reduces)  # before the first backward
        for case, (micro_batches, minibatches) in ROUNDS.items():
            _assert_same_update(one, ddp, case, _weights(one))
            assert micro_batches > 1 and case in CASES
            # One round per mini-batch on each learner (it was one per micro-batch).
            assert _all_reduce_rounds(ddp) == [minibatches, minibatches], case
    finally:
        ddp.shutdown()
