"""FSDP2 with bf16 compute (fp32 master weights and reduce) and CPU offload, against one
fp32 learner.  On a Ray of its own (`own_ray_session`): the two learners need both CPUs,
which the learners of test_fsdp.py's `algos` hold while that module runs."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.learner_updates import (
    learner_config,
    logged,
    policy_weights,
    update_batch,
)


@pytest.mark.slow
@pytest.mark.parametrize("precision", [dict(fsdp_param_dtype="bfloat16"),
                                       dict(model_dtype="bfloat16")],  # verl's policy
                         ids=["fsdp_param_dtype", "model_dtype"])
def test_bf16_mixed_precision_and_cpu_offload_run_close_to_fp32(own_ray_session, precision):
    """bf16 compute (fp32 master weights and reduce) with CPU offload: one update runs
    and lands near the fp32 single learner (bf16 log-probs are good to ~1e-2)."""
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    spaces = {"default_policy": (TEXT_SPACE, TEXT_SPACE)}
    one = learner_config(0).build_learner_group(spaces=spaces)
    mixed = learner_config(2, fsdp_cpu_offload=True, **precision).build_learner_group(
        spaces=spaces)
    try:
        start = policy_weights(one)
        batch = update_batch(vocab=len(start["model.embed_tokens.weight"]))
        norm_one = logged(one.update(batch=batch), "actor/grad_norm")
        norm_mixed = logged(mixed.update(batch=batch), "actor/grad_norm")
        assert norm_mixed == pytest.approx(norm_one, rel=0.05)
        assert policy_weights(mixed)["model.embed_tokens.weight"].dtype == torch.float32
        # Adam moves each weight by <= lr = 1e-4: most moves agree in direction.
        moved_one = torch.cat([(w - start[k]).flatten() for k, w in policy_weights(one).items()])
        moved_mixed = torch.cat([(w - start[k]).flatten() for k, w in policy_weights(mixed).items()])
        assert torch.nn.functional.cosine_similarity(moved_one, moved_mixed, dim=0) > 0.9
    finally:
        mixed.shutdown()
