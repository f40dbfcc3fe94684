"""A learner update with shared prompts (`share_prompt_prefix`) is the unshared update.

On float64 models with RMSNorm kept in float64 (`tests/models/test_shared_prefix.py`
says why): gradients equal to GRAD_REL64 and weights within one AdamW step of that, for
the KL loss, the entropy bonus and two loss aggregations; and prompts really are shared
in every forward pass of the update (policy and reference).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers import local_learner


def _grouped_columns(vocab: int) -> dict[str, np.ndarray]:
    """`fixed_batch`'s two groups of four, each group with one prompt (GRPO's layout)."""
    from tests.helpers.learner_updates import fixed_batch

    columns = fixed_batch(vocab, pad=0)
    for first in (0, 4):
        for i in range(first + 1, first + 4):
            columns["prompt_ids"][i] = columns["prompt_ids"][first]
            columns["prompt_mask"][i] = columns["prompt_mask"][first]
    return columns


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_an_update_with_shared_prompts_is_the_unshared_update(learner, agg, float64_rms_norm,
                                                              monkeypatch):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.learner import module as module_lib

    shared_layouts = []
    real = module_lib.shared_prefix_layout

    def counting(lm, batch):
        layout = real(lm, batch)
        shared_layouts.append(layout is not None)
        return layout

    monkeypatch.setattr(module_lib, "shared_prefix_layout", counting)
    module = learner[0].module[DEFAULT_MODULE_ID]
    columns = _grouped_columns(module.lm.config.vocab_size)
    settings = dict(loss_agg_mode=agg, micro_batch_size_per_learner=4)
    try:
        module.share_prompts = False
        unshared = local_learner.update(learner, columns, **settings)
        assert shared_layouts == []
        module.share_prompts = True
        shared = local_learner.update(learner, columns, **settings)
    finally:
        module.share_prompts = True
    # Two micro-batches of one group each: policy (and reference) forwards all shared.
    assert shared_layouts and all(shared_layouts)
    local_learner.assert_same_update(learner, unshared, shared)
