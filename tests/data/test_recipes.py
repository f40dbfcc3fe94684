"""Recipes: dynamic sampling keeps whole groups, validation metrics, and short CPU runs
with each recipe enabled whose metrics appear."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config


def _batch(scores, group_size, accs=None):
    from rllib_grpo.data.rollout import build_rollout_batch

    n = len(scores)
    accs = accs if accs is not None else [s > 0 for s in scores]
    return build_rollout_batch(
        [[5, 6]] * n, [[7, 1]] * n, [[-0.1, -0.2]] * n, scores,
        [i // group_size for i in range(n)], [False] * n, [False] * n,
        [{"acc": a, "reward": s} for a, s in zip(accs, scores, strict=True)], pad_token_id=0)


def test_filter_groups_drops_flat_groups_and_counts_them():
    from rllib_grpo.data.recipes import filter_groups

    # groups: [1,1] all right, [0,0] all wrong, [1,0] mixed, [0,1] mixed
    batch = _batch([1, 1, 0, 0, 1, 0, 0, 1], 2)
    kept, stats = filter_groups(batch, "acc")
    assert (stats.kept, stats.dropped_all_right, stats.dropped_all_wrong) == (2, 1, 1)
    assert kept.scores.tolist() == [1, 0, 0, 1]
    assert kept.group_index.tolist() == [2, 2, 3, 3]


def test_filter_groups_metric_score_is_the_scorers_value_not_the_shaped_reward():
    from rllib_grpo.data.recipes import filter_groups
    from rllib_grpo.data.rollout import build_rollout_batch

    # One group: the scorer says 1 and 0, the overlong penalty (-1 on the long right answer)
    # makes both rewards 0.  verl's "score" is the scorer's; "seq_reward" the shaped reward.
    infos = [{"acc": True, "score": 1.0, "overlong_reward": -1.0},
             {"acc": False, "score": 0.0, "overlong_reward": 0.0}]
    batch = build_rollout_batch([[5], [5]], [[7, 1], [7]], [[-0.1, -0.2], [-0.1]], [0.0, 0.0],
                                [0, 0], [True, False], [False, False], infos, pad_token_id=0)
    assert filter_groups(batch, "score")[1].kept == 1
    assert filter_groups(batch, "seq_reward")[1].kept == 0


def test_dynamic_sampling_keeps_exactly_prompts_per_step_whole_groups():
    from rllib_grpo.data.recipes import filter_groups, first_groups
    from rllib_grpo.data.rollout import concat_rollouts

    rng = np.random.default_rng(0)
    kept = []
    for _ in range(3):  # three generation batches of 5 groups x 4
        kept.append(filter_groups(_batch(rng.integers(0, 2, 20).tolist(), 4), "score")[0])
    merged = concat_rollouts(kept, pad_token_id=0)
    step = first_groups(merged, 4)
    assert len(step) == 16
    ids, counts = np.unique(step.group_index, return_counts=True)
    assert len(ids) == 4 and (counts == 4).all()
    for g in ids:  # every kept group has a signal
        assert np.std(step.scores[step.group_index == g]) > 0


def test_validation_metrics_mean_best_maj():
    from rllib_grpo.data.recipes import ValidationSample, validation_metrics

    samples = [  # prompt 0: preds 7,7,3 with acc 1,1,0 ; prompt 1: 2,5,5 with acc 1,0,0
        ValidationSample(0, "arithmetic", 1.0, 1.0, "7", True),
        ValidationSample(0, "arithmetic", 1.0, 1.0, "7", True),
        ValidationSample(0, "arithmetic", 0.0, 0.0, "3", True),
        ValidationSample(1, "arithmetic", 1.0, 1.0, "2", True),
        ValidationSample(1, "arithmetic", 0.0, 0.0, "5", True),
        ValidationSample(1, "arithmetic", 0.0, 0.0, "5", True),
    ]
    m = validation_metrics(samples)
    assert m["val-core/arithmetic/acc/mean@3"] == pytest.approx((2 / 3 + 1 / 3) / 2)
    assert m["val-core/arithmetic/acc/best@3/mean"] == 1.0
    assert m["val-core/arithmetic/acc/maj@3/mean"] == 0.5  # majority 7 right, 5 wrong


def test_overlong_penalty_formula():
    from rllib_grpo.algos import overlong_penalty

    # max 10, buffer 4: expected 6 -> lengths 6, 8, 10 give 0, -0.5, -1 (factor 1)
    out = overlong_penalty(torch.tensor([3, 6, 8, 10]), 10, 4, 1.0)
    assert out.tolist() == [0.0, 0.0, -0.5, -1.0]


def _train(**training):
    from rllib_grpo.cli.tensorboard import flatten

    algo = tiny_config(**training).build_algo()
    try:
        return [flatten(algo.train()) for _ in range(2)], algo
    finally:
        algo.stop()


def test_dapo_recipe_runs(ray_session):
    results, _ = _train(filter_groups=True, filter_groups_metric="seq_reward",
                        max_num_gen_batches=0,
                        group_size=4, clip_ratio_high=0.28, clip_ratio_c=10.0, use_kl_loss=False,
                        overlong_buffer_len=2, mask_truncated_completions=True,
                        model_path="builtin:demo")
    for r in results:
        assert r["train/num_gen_batches"] >= 1
        assert r["groups/zero_variance_frac"] == 0.0  # only groups with a signal were kept
        assert "filter_groups/dropped_all_wrong" in r
        assert "response/truncated_masked_frac" in r
        assert r["env_runners/num_env_steps_sampled"] >= 16


def test_dynamic_sampling_gives_up_with_a_clear_message(ray_session):
    # The random tiny model never answers right: every group is all wrong.
    with pytest.raises(Exception, match="too hard"):
        _train(filter_groups=True, filter_groups_metric="score", max_num_gen_batches=2,
               model_path="builtin:tiny")


@pytest.mark.parametrize("training", [
    {"adv_estimator": "remax", "group_size": 2},
    {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4},
    {"policy_loss": "cispo"},
    {"val_every": 1, "val_num_prompts": 4, "val_n": 3, "val_temperature": 1.0},
])
def test_recipe_short_run(ray_session, training):
    results, _ = _train(model_path="builtin:demo", **training)
    r = results[-1]
    assert np.isfinite(r["actor/pg_loss"])
    if "val_every" in training:
        assert 0.0 <= r["val-core/arithmetic/acc/mean@3"] <= 1.0
        assert "val-core/arithmetic/acc/maj@3/mean" in r


def test_evaluate_from_start_scores_the_same_heldout_prompts_again(ray_session):
    """The demo's before/after accuracy compares the same held-out prompts."""
    from rllib_grpo.samplers import SamplingParams

    algo = tiny_config(model_path="builtin:demo").build_algo()
    try:
        runner = algo.env_runner_group.local_env_runner

        def indices(samples):
            return [s.prompt_index for s in samples]

        greedy = SamplingParams(temperature=0.0, max_tokens=4)
        first = indices(runner.evaluate(6, 1, greedy, start=0))
        assert indices(runner.evaluate(6, 1, greedy)) != first  # calls continue through them
        assert indices(runner.evaluate(6, 1, greedy, start=0)) == first
    finally:
        algo.stop()
