"""Loss aggregation: hand values, guards, and micro-batch / data-parallel invariance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rllib_grpo.algos import AGG_MODES, agg_loss

SEQ_MODES = ("seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")

LOSS = torch.tensor([[1.0, 2.0, 30.0], [4.0, 50.0, 6.0]])


def test_agg_modes_tuple():
    assert AGG_MODES == (
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    )


def test_token_sum_verl_golden():
    # verl test_loss_aggregation_on_cpu: (1 + 2 + 4 + 6) · dp_size 4 = 52
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]])
    assert agg_loss(LOSS, mask, "token-sum", dp_size=4).item() == 52.0


# mask [[1,1,1],[1,0,0]]: row sums 1+2+30 = 33 (3 tokens) and 4 (1 token); 4 tokens, 2 seqs
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
HAND = {
    "token-mean": 37 / 4,  # (33 + 4) / 4 tokens
    "token-sum": 37.0,
    "seq-mean-token-sum": 37 / 2,  # (33 + 4) / 2 seqs
    "seq-mean-token-mean": (11 + 4) / 2,  # (33/3 + 4/1) / 2
    "seq-mean-token-sum-norm": 37 / 2 / 3,  # seq-mean / horizon T = 3
}


@pytest.mark.parametrize("mode", AGG_MODES)
def test_hand_values_local_counts(mode):
    assert agg_loss(LOSS, MASK, mode).item() == pytest.approx(HAND[mode])


@pytest.mark.parametrize("mode", AGG_MODES)
def test_empty_rows_do_not_count(mode):
    # an all-padding row (e.g. added to even out micro-batch counts) changes nothing
    loss = torch.cat([LOSS, torch.tensor([[7.0, 7.0, 7.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3)])
    assert agg_loss(loss, mask, mode).item() == pytest.approx(HAND[mode])


def test_global_counts_and_dp_scaling():
    # token-mean: 37 / 16 global tokens · dp 2 = 4.625
    assert agg_loss(LOSS, MASK, "token-mean", dp_size=2, global_num_tokens=16).item() == 4.625
    # seq modes: local sum / 8 global seqs · dp 2
    got = agg_loss(LOSS, MASK, "seq-mean-token-sum", dp_size=2, global_num_seqs=8)
    assert got.item() == pytest.approx(37 / 8 * 2)
    got = agg_loss(LOSS, MASK, "seq-mean-token-mean", dp_size=2, global_num_seqs=8)
    assert got.item() == pytest.approx(15 / 8 * 2)
    got = agg_loss(LOSS, MASK, "seq-mean-token-sum-norm", dp_size=2, global_num_seqs=8, horizon=10)
    assert got.item() == pytest.approx(37 / 8 * 2 / 10)
    # counts may be tensors (the result of an all-reduce)
    got = agg_loss(LOSS, MASK, "token-mean", global_num_tokens=torch.tensor(8))
    assert got.item() == pytest.approx(37 / 8)


def test_dr_grpo_horizon_default_is_padded_length():
    wide_loss = torch.nn.functional.pad(LOSS, (0, 5))
    wide_mask = torch.nn.functional.pad(MASK, (0, 5))
    # T = 8 now: 37 / 2 / 8
    got = agg_loss(wide_loss, wide_mask, "seq-mean-token-sum-norm")
    assert got.item() == pytest.approx(37 / 2 / 8)
    got = agg_loss(wide_loss, wide_mask, "seq-mean-token-sum-norm", horizon=3)
    assert got.item() == pytest.approx(HAND["seq-mean-token-sum-norm"])


@pytest.mark.parametrize(
    ("mode", "missing"),
    [("token-mean", "global_num_tokens")] + [(m, "global_num_seqs") for m in SEQ_MODES],
)
def test_missing_global_count_with_dp_raises(mode, missing):
    with pytest.raises(ValueError, match=missing):
        agg_loss(LOSS, MASK, mode, dp_size=2)


def test_token_sum_needs_no_counts_and_bad_args_raise():
    assert agg_loss(LOSS, MASK, "token-sum", dp_size=3).item() == 111.0  # 37 · 3
    with pytest.raises(ValueError, match="Known: token-mean"):
        agg_loss(LOSS, MASK, "seq-mean")
    with pytest.raises(ValueError, match="dp_size"):
        agg_loss(LOSS, MASK, "token-mean", dp_size=0)
    with pytest.raises(ValueError, match="differ"):
        agg_loss(LOSS, MASK[:, :2], "token-mean")


@pytest.mark.parametrize("mode", AGG_MODES)
@pytest.mark.parametrize("with_counts", [False, True])
def test_all_empty_micro_batch_is_zero_not_nan(mode, with_counts):
    loss = torch.tensor([[1.0, float("nan")], [float("inf"), 3.0]], requires_grad=True)
    counts = {"global_num_tokens": 0, "global_num_seqs": 0} if with_counts else {}
    out = agg_loss(loss, torch.zeros(2, 2), mode, **counts)
    assert out.item() == 0.0
    out.backward()
    assert torch.all(loss.grad == 0)


def test_padding_garbage_does_not_leak():
    loss = LOSS.clone()
    loss[1, 1:] = float("nan")
    for mode in AGG_MODES:
        assert agg_loss(loss, MASK, mode).item() == pytest.approx(HAND[mode])


def test_global_token_mean_fixes_legacy_bias():
    # verl issue #5625: seq A has 10 tokens of loss 1, seq B 1000 tokens of loss 0,
    # one micro-batch each.  The true token mean is 10 / 1010; the legacy
    # per-micro-batch mean gave (1 + 0) / 2 = 0.5.
    a_loss, a_mask = torch.ones(1, 1000), torch.zeros(1, 1000)
    a_mask[0, :10] = 1
    b_loss, b_mask = torch.zeros(1, 1000), torch.ones(1, 1000)
    total = sum(
        agg_loss(loss, mask, "token-mean", global_num_tokens=1010)
        for loss, mask in ((a_loss, a_mask), (b_loss, b_mask))
    )
    assert total.item() == pytest.approx(10 / 1010)


# ------------------------------------------------------------- invariance (property)


@st.composite
def split_batches(draw):
    """A mini-batch, an assignment of its rows to ranks, and micro-batch cuts per rank."""
    num_rows = draw(st.integers(1, 8))
    num_cols = draw(st.integers(1, 5))
    values = draw(
        st.lists(
            st.floats(-5, 5, allow_nan=False),
            min_size=num_rows * num_cols,
            max_size=num_rows * num_cols,
        )
    )
    bits = draw(st.lists(st.booleans(), min_size=num_rows * num_cols, max_size=num_rows * num_cols))
    dp_size = draw(st.integers(1, 3))
    rank_of_row = draw(st.lists(st.integers(0, dp_size - 1), min_size=num_rows, max_size=num_rows))
    micro_size = draw(st.integers(1, 3))
    loss = torch.tensor(values, dtype=torch.float64).reshape(num_rows, num_cols)
    mask = torch.tensor(bits, dtype=torch.float64).reshape(num_rows, num_cols)
    return loss, mask, dp_size, rank_of_row, micro_size


@pytest.mark.parametrize("mode", AGG_MODES)
@settings(max_examples=60, deadline=None)
@given(case=split_batches())
def test_microbatch_and_dp_split_invariance(mode, case):
    loss, mask, dp_size, rank_of_row, micro_size = case

    # single process, whole mini-batch, local counts
    full_leaf = loss.clone().requires_grad_(True)
    full = agg_loss(full_leaf, mask, mode)
    full.backward()

    # simulated ranks: global counts of the whole mini-batch, each rank sums its
    # micro-batch losses (repeated backward), gradients are averaged over ranks
    split_leaf = loss.clone().requires_grad_(True)
    counts = {
        "dp_size": dp_size,
        "global_num_tokens": mask.sum(),
        "global_num_seqs": (mask.sum(-1) > 0).sum(),
        "horizon": mask.shape[-1],
    }
    rank_losses = []
    for rank in range(dp_size):
        rows = [i for i, r in enumerate(rank_of_row) if r == rank]
        rank_total = torch.zeros((), dtype=torch.float64)
        for start in range(0, len(rows), micro_size):
            idx = torch.tensor(rows[start : start + micro_size])
            rank_total = rank_total + agg_loss(split_leaf[idx], mask[idx], mode, **counts)
        rank_losses.append(rank_total)
    averaged = torch.stack(rank_losses).mean()
    averaged.backward()

    torch.testing.assert_close(averaged.detach(), full.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(split_leaf.grad, full_leaf.grad, rtol=1e-10, atol=1e-10)
