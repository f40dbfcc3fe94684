"""`explain`: the resolved plan and one test per pitfall."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config


def _explain(**training):
    return tiny_config(**training).explain()


def test_plan_lines():
    text = _explain(prompts_per_step=8, group_size=4, prompts_per_minibatch=4)
    assert "trajectories per step:         32" in text
    assert "optimizer steps per step:      2" in text
    assert "KL: in the loss, low_var_kl" in text
    assert ("packed rows, no padding (use_remove_padding), one copy of each prompt per group "
            "where the attention takes a mask (share_prompt_prefix); old log-probs from a "
            "separate") in text
    assert "from the update's own forward" in _explain(prompts_per_step=8, group_size=4)
    assert "No pitfalls found." in text


@pytest.mark.parametrize("training, needle", [
    ({"group_size": 1}, "a group of one has no relative signal"),
    ({"use_kl_in_reward": True, "use_kl_loss": True}, "applied twice"),
    ({"norm_adv_by_std_in_grpo": False}, "Dr.GRPO half-applied"),
    ({"loss_agg_mode": "seq-mean-token-sum-norm"}, "Dr.GRPO half-applied"),
    ({"prompts_per_minibatch": 3}, "must divide prompts_per_step"),
    ({"use_dynamic_bsz": True, "max_tokens_per_micro_batch": 8}, "below the longest sequence"),
    ({"temperature": 0.0}, "no group has a signal"),
    ({"temperature": 0.1}, "temperature=0.1 is low"),
    ({"policy_loss": "gspo"}, "always aggregates with 'seq-mean-token-mean'"),
    ({"use_dynamic_bsz": True, "max_tokens_per_micro_batch": 64, "use_remove_padding": False},
     "verl's budget assumes padding removal"),
])
def test_each_pitfall_is_reported(training, needle):
    assert needle in _explain(**training)
