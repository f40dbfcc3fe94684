"""Advantage estimators and the group / masked statistics they use.

Expected values are derived by hand in the comments.  EPS = 1e-6 is GRPO's epsilon.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_grpo.algos import (
    ADV_ESTIMATORS,
    compute_advantage,
    group_index,
    group_mean_std,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

EPS = 1e-6
GROUPED = ("grpo", "rloo", "grpo_passk", "opo", "reinforce_plus_plus_baseline", "gpg")


def outcome(rewards, lengths, T=None):
    """(B, T) token rewards with each outcome on the last response token, and the mask."""
    T = T or max(max(lengths), 1)
    token_rewards = torch.zeros(len(rewards), T, dtype=torch.float64)
    mask = torch.zeros(len(rewards), T, dtype=torch.float64)
    for i, (r, n) in enumerate(zip(rewards, lengths, strict=True)):
        mask[i, :n] = 1
        if n:
            token_rewards[i, n - 1] = r
    return token_rewards, mask


def per_response(adv, mask):
    """The scalar of each row (rows are constant on their tokens); 0 for empty rows."""
    assert torch.all(adv[mask == 0] == 0), "advantages must be zero on padding"
    return (adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)


# ----------------------------------------------------------------- statistics helpers


def test_group_mean_std_verl_golden():
    # verl tests/utils/test_groupwise.py: groups {0: [1, 3], 1: [2]}
    # mean_0 = 2, std_0 = sqrt(((1-2)^2 + (3-2)^2) / (2-1)) = sqrt(2); singleton: mean 0, std 1
    mean, std, count = group_mean_std(torch.tensor([1.0, 2.0, 3.0]), [0, 1, 0])
    torch.testing.assert_close(mean, torch.tensor([2.0, 0.0]))
    torch.testing.assert_close(std, torch.tensor([math.sqrt(2.0), 1.0]))
    assert count.tolist() == [2, 1]


def test_group_index_hashables():
    # numbered in order of first appearance
    assert group_index(["b", "a", "b"])[0].tolist() == [0, 1, 0]
    assert group_index(np.array(["u1", "u2", "u1", "u3"]))[0].tolist() == [0, 1, 0, 2]
    assert group_index(np.array([7, 3, 7]))[0].tolist() == [0, 1, 0]
    assert group_index(torch.tensor([5, 5, 9]))[1] == 2
    with pytest.raises(ValueError, match="3 group ids for a batch of 2"):
        group_index(["a", "b", "c"], batch_size=2)


def test_masked_reductions_ignore_garbage_under_mask():
    x = torch.tensor([[1.0, 2.0, float("nan")], [3.0, float("inf"), 5.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_sum(x, m).item() == 11.0  # 1 + 2 + 3 + 5
    assert masked_mean(x, m).item() == 2.75  # 11 / 4
    torch.testing.assert_close(masked_mean(x, m, dim=-1), torch.tensor([1.5, 4.0]))
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # empty mask -> 0, not nan


def test_masked_var_and_whiten():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1.0, 1.0, 1.0, 0.0])
    # mean 2; squared deviations 1, 0, 1 -> biased 2/3, unbiased 2/3 * 3/2 = 1
    torch.testing.assert_close(masked_var(x, m), torch.tensor(1.0))
    torch.testing.assert_close(masked_var(x, m, unbiased=False), torch.tensor(2.0 / 3.0))
    scale = 1.0 / math.sqrt(1.0 + 1e-8)
    torch.testing.assert_close(masked_whiten(x, m)[:3], torch.tensor([-1.0, 0.0, 1.0]) * scale)
    torch.testing.assert_close(
        masked_whiten(x, m, shift_mean=False)[:3], torch.tensor([-1.0, 0.0, 1.0]) * scale + 2.0
    )
    with pytest.raises(ValueError, match="empty"):
        masked_var(x, torch.zeros(4))
    with pytest.raises(ValueError, match="one"):
        masked_var(x, torch.tensor([0.0, 1.0, 0.0, 0.0]))


# ----------------------------------------------------------------------------- GRPO

# groups: "p" rewards [0, 1, 2] -> mean 1, std sqrt((1 + 0 + 1) / 2) = 1
#         "q" rewards [3, 3]    -> all equal -> exactly 0
#         "r" reward  [5]       -> singleton: mean 0, std 1
#         "s" an empty response (no tokens, so no reward) -> all-zero row
GRPO_IDS = ["p", "q", "p", "r", "q", "p", "s"]
GRPO_REWARDS = [0.0, 3.0, 1.0, 5.0, 3.0, 2.0, 0.0]
GRPO_LENGTHS = [3, 1, 2, 3, 2, 1, 0]


def test_grpo_hand_values():
    r, m = outcome(GRPO_REWARDS, GRPO_LENGTHS)
    adv, ret = compute_advantage("grpo", r, m, GRPO_IDS)
    assert adv is ret
    # p: (0-1)/(1+EPS), (1-1)/(1+EPS), (2-1)/(1+EPS); q: 0, 0; r: 5/(1+EPS); s: 0
    a = 1 / (1 + EPS)
    expected = torch.tensor([-a, 0.0, 0.0, 5 * a, 0.0, a, 0.0], dtype=torch.float64)
    torch.testing.assert_close(per_response(adv, m), expected)
    # broadcast over the tokens of each response
    torch.testing.assert_close(adv[0], torch.full((3,), -1 / (1 + EPS), dtype=torch.float64))


def test_dr_grpo_no_std():
    r, m = outcome(GRPO_REWARDS, GRPO_LENGTHS)
    adv, _ = compute_advantage("grpo", r, m, GRPO_IDS, norm_adv_by_std_in_grpo=False)
    # r - mean: p: -1, 0, 1; q: 0, 0; r: 5 - 0; s: 0
    expected = torch.tensor([-1.0, 0.0, 0.0, 5.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(per_response(adv, m), expected)


def test_grpo_int_and_numpy_ids_agree_with_strings():
    r, m = outcome(GRPO_REWARDS, GRPO_LENGTHS)
    by_str, _ = compute_advantage("grpo", r, m, GRPO_IDS)
    by_int, _ = compute_advantage("grpo", r, m, [10, 20, 10, 30, 20, 10, 40])
    by_np, _ = compute_advantage("grpo", r, m, np.array(GRPO_IDS, dtype=object))
    torch.testing.assert_close(by_str, by_int)
    torch.testing.assert_close(by_str, by_np)


def test_grpo_equal_rewards_exactly_zero_even_when_inexact():
    # In float32, torch.full((6,), 0.3).mean() != 0.3 (off by 3e-8), and the std is 0, so a
    # naive (r - mean) / (std + 1e-6) gives 0.03 instead of 0; likewise 2.9 three times.
    r, m = outcome([0.3] * 6 + [2.9] * 3, [1, 2, 3, 1, 2, 3, 1, 1, 1])
    adv, _ = compute_advantage("grpo", r.float(), m.float(), [0] * 6 + [1] * 3)
    assert torch.count_nonzero(adv) == 0


def test_grpo_empty_row_still_counts_in_group_stats():
    # group [0 (empty response), 2]: mean 1, std sqrt(2); only the non-empty row shows
    r, m = outcome([0.0, 2.0], [0, 2])
    adv, _ = compute_advantage("grpo", r, m, ["g", "g"])
    assert torch.all(adv[0] == 0)
    torch.testing.assert_close(adv[1], torch.full((2,), 1 / (math.sqrt(2) + EPS)).double())


def test_grpo_sums_all_token_rewards():
    # r_i = Σ_t token_level_rewards (a KL-in-reward penalty spread over tokens counts)
    r = torch.tensor([[0.5, 0.5, 1.0], [0.0, 0.0, 0.0]])
    m = torch.ones(2, 3)
    adv, _ = compute_advantage("grpo", r, m, ["g", "g"], norm_adv_by_std_in_grpo=False)
    # r = [2, 0], mean 1 -> [1, -1]
    torch.testing.assert_close(adv, torch.tensor([[1.0] * 3, [-1.0] * 3]))


@settings(max_examples=60, deadline=None)
@given(
    groups=st.lists(
        st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=2, max_size=6),
        min_size=1,
        max_size=5,
    ),
    norm=st.booleans(),
)
def test_grpo_zero_mean_per_group(groups, norm):
    rewards = [x for g in groups for x in g]
    ids = [f"uid-{k}" for k, g in enumerate(groups) for _ in g]
    r, m = outcome(rewards, [1] * len(rewards))
    adv, _ = compute_advantage("grpo", r.float(), m.float(), ids, norm_adv_by_std_in_grpo=norm)
    scalars = adv[:, 0].double()
    start = 0
    for g in groups:
        block = scalars[start : start + len(g)]
        scale = max(1.0, float(block.abs().max()))
        assert abs(float(block.sum())) <= 1e-5 * scale * len(g)
        if len(set(g)) == 1:
            assert torch.all(block == 0)
        start += len(g)


# ----------------------------------------------------------------------- the others


def test_rloo_hand_values():
    # p: [0, 1, 2], n = 3 -> 3/2 (r - 1) = [-1.5, 0, 1.5]  (= r_i - mean of the others)
    # q: [3, 3] -> 0;  r: singleton -> A = r = 5 (loop semantics);  s: singleton 0 -> 0
    r, m = outcome(GRPO_REWARDS, [1] * 7)
    adv, _ = compute_advantage("rloo", r, m, GRPO_IDS)
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([-1.5, 0.0, 0.0, 5.0, 0.0, 1.5, 0.0], dtype=torch.float64)
    )


def test_grpo_passk_hand_values():
    # g1: [0, 2, 1]: r_max 2 (index 1), r_2nd 1, gap 1, std([0, 2, 1]) = 1 -> 1/(1+EPS)
    # g2: [2, 2, 0]: a tie for the max -> gap 0 -> all zero
    r, m = outcome([0.0, 2.0, 1.0, 2.0, 2.0, 0.0], [1] * 6)
    ids = ["g1"] * 3 + ["g2"] * 3
    adv, _ = compute_advantage("grpo_passk", r, m, ids)
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([0.0, 1 / (1 + EPS), 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    )
    adv, _ = compute_advantage("grpo_passk", r, m, ids, norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(
        adv[:, 0], torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    )


def test_grpo_passk_needs_two_per_group():
    r, m = outcome([1.0, 0.0, 1.0], [1] * 3)
    with pytest.raises(ValueError, match="at least 2 samples"):
        compute_advantage("grpo_passk", r, m, ["a", "a", "b"])


def test_opo_hand_values():
    # group a: lengths [1, 3], rewards [1, 0] -> b = (1·1 + 3·0) / 4 = 0.25 -> [0.75, -0.25]
    # group b: equal rewards [2, 2] with lengths [2, 1] -> b = 2 -> [0, 0]
    # group c: singleton -> b = 0 -> A = 4
    r, m = outcome([1.0, 0.0, 2.0, 2.0, 4.0], [1, 3, 2, 1, 2])
    adv, _ = compute_advantage("opo", r, m, ["a", "a", "b", "b", "c"])
    torch.testing.assert_close(
        per_response(adv, m), torch.tensor([0.75, -0.25, 0.0, 0.0, 4.0], dtype=torch.float64)
    )


def test_reinforce_plus_plus_gamma_one():
    # returns: row 0 [1, 1, 1]; row 1 [2, 2, pad]
    # valid values [1, 1, 1, 2, 2]: mean 1.4, deviations [-.4, -.4, -.4, .6, .6]
    # Σ dev² = 3·0.16 + 2·0.36 = 1.2 -> unbiased var = 1.2 / 4 = 0.3
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    adv, ret = compute_advantage("reinforce_plus_plus", r, m, gamma=1.0)
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]).double())
    s = 1 / math.sqrt(0.3 + 1e-8)
    expected = torch.tensor([[-0.4, -0.4, -0.4], [0.6, 0.6, 0.0]], dtype=torch.float64) * s
    torch.testing.assert_close(adv, expected)


def test_reinforce_plus_plus_discount():
    # gamma 0.5: row 0 [0.25, 0.5, 1]; row 1 [1, 2, pad]
    r = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    adv, ret = compute_advantage("reinforce_plus_plus", r, m, gamma=0.5)
    torch.testing.assert_close(ret, torch.tensor([[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]]).double())
    # mean 4.75 / 5 = 0.95; dev [-.7, -.45, .05, .05, 1.05];
    # Σ dev² = .49 + .2025 + .0025 + .0025 + 1.1025 = 1.8 -> unbiased var 0.45
    s = 1 / math.sqrt(0.45 + 1e-8)
    expected = torch.tensor([[-0.7, -0.45, 0.05], [0.05, 1.05, 0.0]], dtype=torch.float64) * s
    torch.testing.assert_close(adv, expected)


def test_reinforce_plus_plus_skips_observation_tokens():
    # mask [1, 0, 1], gamma 0.5; the reward 9 on the observation token is ignored and the
    # running return is carried through it: G_2 = 1, G_1 = carry (returns 0 there), G_0 = 0.5
    r = torch.tensor([[0.0, 9.0, 1.0], [0.0, 0.0, 3.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0]], dtype=torch.float64)
    _, ret = compute_advantage("reinforce_plus_plus", r, m, gamma=0.5)
    torch.testing.assert_close(ret[0], torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(ret[1], torch.tensor([0.75, 1.5, 3.0], dtype=torch.float64))


def test_reinforce_plus_plus_needs_two_tokens():
    r, m = outcome([1.0], [1])
    with pytest.raises(ValueError):
        compute_advantage("reinforce_plus_plus", r, m)


def test_reinforce_plus_plus_baseline_hand_values():
    # group a: [0, 2] -> centered [-1, 1]; group b: singleton [1] -> centered 1
    # token values (lengths 2, 1, 2): [-1, -1 | 1 | 1, 1]: mean 0.2,
    # dev [-1.2, -1.2, .8, .8, .8], Σ dev² = 2·1.44 + 3·0.64 = 4.8 -> unbiased var 1.2
    r, m = outcome([0.0, 2.0, 1.0], [2, 1, 2])
    adv, _ = compute_advantage("reinforce_plus_plus_baseline", r, m, ["a", "a", "b"])
    s = 1 / math.sqrt(1.2 + 1e-8)
    expected = torch.tensor([[-1.2, -1.2], [0.8, 0.0], [0.8, 0.8]], dtype=torch.float64) * s
    torch.testing.assert_close(adv, expected)


def test_remax_hand_values():
    # returns = reverse cumsum of r·m: row 0 [1, 1, 0]; row 1 [2, 0, 0]
    # A = returns - b·m with b = [0.5, 3]: row 0 [0.5, 0.5, 0]; row 1 [-1, 0, 0]
    r = torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]])
    m = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    adv, ret = compute_advantage("remax", r, m, reward_baselines=torch.tensor([0.5, 3.0]))
    torch.testing.assert_close(ret, torch.tensor([[1.0, 1.0, 0.0], [2.0, 0.0, 0.0]]))
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.0], [-1.0, 0.0, 0.0]]))


def test_remax_without_baselines_is_a_clear_error():
    r, m = outcome([1.0], [1])
    with pytest.raises(ValueError, match="reward_baselines"):
        compute_advantage("remax", r, m)


def test_gpg_hand_values():
    # scores [1, 0, 0, 3]: 2 non-zero -> alpha = 4 / 2 = 2
    # means: a 0.5, b 1.5 -> 2·[0.5, -0.5, -1.5, 1.5] = [1, -1, -3, 3]
    r, m = outcome([1.0, 0.0, 0.0, 3.0], [1] * 4)
    ids = ["a", "a", "b", "b"]
    adv, _ = compute_advantage("gpg", r, m, ids)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, -1.0, -3.0, 3.0]).double())
    adv, _ = compute_advantage("gpg", r, m, ids, f_norm=2.0)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -1.5, 1.5]).double())
    # all-zero scores: alpha = 4 / max(0, 1) = 4, advantages all 0
    r0, _ = outcome([0.0] * 4, [1] * 4)
    assert torch.count_nonzero(compute_advantage("gpg", r0, m, ids)[0]) == 0


# -------------------------------------------------------------------- common contract


@pytest.mark.parametrize("estimator", GROUPED)
def test_grouped_estimators_need_group_ids(estimator):
    r, m = outcome([1.0, 0.0], [1, 1])
    with pytest.raises(ValueError, match="group_ids"):
        compute_advantage(estimator, r, m)


@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATORS.names()))
def test_outputs_are_zero_on_padding(estimator):
    r, m = outcome([1.0, 0.0, 3.0, 2.0], [3, 0, 1, 2], T=4)
    r[:, -1] = 7.0  # stray reward on padding must not leak into advantages
    m[2, 0] = 1.0
    adv, ret = compute_advantage(
        estimator, r, m, ["a", "a", "b", "b"], reward_baselines=torch.zeros(4)
    )
    assert adv.shape == ret.shape == r.shape
    assert torch.all(adv[m == 0] == 0)
    assert torch.all(ret[m == 0] == 0)
    assert not adv.requires_grad


def test_unknown_estimator_and_bad_shapes():
    r, m = outcome([1.0], [1])
    with pytest.raises(ValueError, match="Known: gpg, grpo"):
        compute_advantage("gae_typo", r, m, ["a"])
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        compute_advantage("grpo", r, m[:, :0], ["a"])


def test_scores_land_on_the_last_model_token_even_with_holes():
    from rllib_grpo.algos import scores_to_tokens

    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0],    # a plain response of 2 tokens
                         [1.0, 0.0, 0.0, 1.0],    # a multi-turn mask: env tokens at 1-2
                         [0.0, 0.0, 0.0, 0.0]])   # empty
    out = scores_to_tokens(torch.tensor([2.0, 3.0, 5.0]), mask)
    assert out.tolist() == [[0, 2, 0, 0], [0, 0, 0, 3], [5, 0, 0, 0]]
