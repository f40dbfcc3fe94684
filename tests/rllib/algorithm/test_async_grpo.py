"""One-step-off-policy GRPO (``max_staleness``): the synchronous path is untouched at 0,
no trained trajectory is older than the bound, and the pieces around it (validation,
explain, the gap metrics, the stale-group guard, checkpoints) do what docs/async.md says."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config
from tests.helpers.versioned_batches import versioned_batch


def _remote(config):
    return config.env_runners(num_env_runners=1, create_local_env_runner=False)


def _learner_state(algo) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("value,needle", [
    (-1, "max_staleness=-1 must be an integer >= 0"),
    (1.5, "max_staleness=1.5 must be an integer >= 0"),
    (True, "max_staleness=True must be an integer >= 0"),
    (1, "set num_env_runners >= 1"),
])
def test_validation_refuses_bad_max_staleness(value, needle):
    config = tiny_config(max_staleness=value)  # a local env runner only
    with pytest.raises(ValueError, match="max_staleness") as error:
        config.validate()
    assert needle in str(error.value)


def test_remote_runners_accept_max_staleness():
    config = _remote(tiny_config(max_staleness=2))
    config.validate()  # no error


def test_explain_shows_the_pipeline_and_the_bound():
    from rllib_grpo.rllib.config.explain import explain_config

    sync = explain_config(tiny_config())
    assert "rollouts:                      synchronous" in sync
    text = explain_config(_remote(tiny_config(max_staleness=1)))
    assert "one step off policy" in text and "max_staleness=1" in text
    assert "old log-probs from the update's own forward" in text
    assert "rollout_is='token'" in text  # the pitfall: no correction of the gap


def test_the_old_log_probs_come_from_the_update_under_staleness_too():
    """One mini-batch, one epoch: the learner's weights at the update are the old policy
    whatever weights sampled, so the update's own forward gives the old log-probs (the
    equality with a separate pass: tests/rllib/learner/test_packing.py)."""
    from rllib_grpo.rllib.config.staleness import old_log_probs_from_update

    assert old_log_probs_from_update(tiny_config())
    assert old_log_probs_from_update(_remote(tiny_config(max_staleness=1, rollout_is="token")))
    assert not old_log_probs_from_update(_remote(tiny_config(max_staleness=1, num_epochs=2)))


# --------------------------------------------------------------------------- gap metrics
def test_rollout_gap_is_split_by_staleness():
    from rllib_grpo.rllib.learner.rollout_gap import rollout_gap_metrics

    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]))
    rollout = torch.log(torch.tensor([[0.5, 0.4], [0.25, 0.9], [0.5, 0.5]]))
    valid = torch.tensor([[True, True], [True, False], [True, True]])  # 0.9 is padding
    metrics = rollout_gap_metrics(rollout, old, valid, torch.tensor([0, 1, 0]))
    # staleness 0: rows 0 and 2; the only gap is 0.4 vs 0.5.
    assert metrics["training/rollout_log_probs_diff_max/staleness_0"] == pytest.approx(
        np.log(0.5 / 0.4), rel=1e-5)
    assert metrics["training/rollout_probs_diff_mean/staleness_0"] == pytest.approx(0.1 / 4)
    # staleness 1: row 1's valid token, 0.25 vs 0.5 (the padded 0.9 does not count).
    assert metrics["training/rollout_log_probs_diff_max/staleness_1"] == pytest.approx(
        np.log(2.0), rel=1e-5)
    assert metrics["training/rollout_probs_diff_mean/staleness_1"] == pytest.approx(0.25)
    assert metrics["training/rollout_log_probs_diff_max"] == pytest.approx(np.log(2.0), rel=1e-5)
    assert not any("staleness" in key for key in rollout_gap_metrics(rollout, old, valid))


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_importance_weights_by_level_against_the_products_written_out(level):
    from rllib_grpo.algos.rollout_is import truncated_is_weights

    old = torch.log(torch.tensor([[0.5, 0.5, 0.5], [0.4, 0.2, 0.9], [0.3, 0.3, 0.3]]))
    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.5], [0.8, 0.1, 0.01], [0.3, 0.3, 0.3]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])  # padding counts no
    weights, metrics = truncated_is_weights(old, rollout, mask, threshold=1.5, level=level)
    if level == "token":  # ratios 1, 2 | 0.5, 2 -> truncated at 1.5
        expected = [[1.0, 1.5, 0.0], [0.5, 1.5, 0.0], [0.0, 0.0, 0.0]]
        truncated = 2 / 4
    else:  # products over the masked tokens: 1 * 2 = 2 -> 1.5; 0.5 * 2 = 1 (0.9/0.01 padding)
        expected = [[1.5, 1.5, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
        truncated = 2 / 4
    assert torch.allclose(weights, torch.tensor(expected), atol=1e-6)
    assert metrics["rollout_corr/is_truncated_frac"] == pytest.approx(truncated)
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(
        sum(map(sum, expected)) / 4, rel=1e-6)


@pytest.mark.parametrize("value", ["geometric", "TOKEN"])
def test_unknown_rollout_is_level_is_refused_with_the_levels(value):
    with pytest.raises(ValueError, match="rollout_is=.*one of: None, token, sequence"):
        tiny_config(rollout_is=value).validate()


# --------------------------------------------------------------------------- stale guard
class _StubAlgo:
    """What `PipelinedSampling.draw`/`fill` use of `GRPO`: fresh groups at the current
    version (every fresh group's rewards vary)."""

    def __init__(self, version: int) -> None:
        self.version, self.last_rollout = version, None
        self.fresh_calls: list[int] = []

    def _sample_groups(self, num_prompts: int):
        self.fresh_calls.append(num_prompts)
        return versioned_batch([self.version] * num_prompts, first_group=100 * len(self.fresh_calls))


def _pipeline(algo, ready):
    """A pipeline with ``ready`` taken from the runners (no Ray: the driver state only)."""
    from rllib_grpo.rllib.algorithm.async_pipeline import PipelinedSampling
    from rllib_grpo.rllib.algorithm.sampling import SamplingServices

    def unused(*args):
        raise AssertionError("not expected here")

    services = SamplingServices(
        env_runner_group=None, learner_group=None, sample_groups=algo._sample_groups,
        claim_prompts=unused, sync_weights=unused, log_value=unused,
        sample_on_runners=unused, log_fault_counts=unused, aggregate_runner_metrics=unused,
        record_runner_state=unused)
    pipeline = PipelinedSampling(services, max_staleness=1)
    pipeline._learner_version = pipeline._runner_version = algo.version
    pipeline._ready, pipeline._ready_prompts = ready, ready.num_groups
    return pipeline


def test_groups_older_than_the_bound_are_dropped_and_sampled_again():
    algo = _StubAlgo(version=5)
    # The background batch: 4 groups sampled with versions 4, 3, 4, 5 (3 is two updates old).
    pipeline = _pipeline(algo, versioned_batch([4, 3, 4, 5]))
    rollout = pipeline.fill(4)
    assert pipeline.dropped_stale_groups == 1
    assert algo.fresh_calls == [1]  # exactly the dropped group's place, sampled fresh
    staleness = 5 - rollout.weights_version
    assert len(rollout) == 8 and staleness.max() <= 1
    assert sorted(set(rollout.weights_version.tolist())) == [4, 5]
    assert rollout.num_groups == 4


def test_dynamic_sampling_counts_only_kept_groups_under_staleness():
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    algo = _StubAlgo(version=5)
    algo.config = _remote(tiny_config(max_staleness=1, filter_groups=True,
                                      filter_groups_metric="seq_reward", prompts_per_step=4))
    logged: dict[str, float] = {}
    algo._log_dict = logged.update
    # Background batch: group 1 is two updates old (dropped), group 2 has no signal (filtered).
    algo._sampling = _pipeline(algo, versioned_batch([4, 3, 4, 4], [True, True, False, True]))
    rollout = GRPO._sample_step(algo)
    assert algo.last_rollout is rollout
    assert rollout.num_groups == 4 and (5 - rollout.weights_version).max() <= 1
    for g in np.unique(rollout.group_index):  # every trained group carries a signal
        assert np.std(rollout.scores[rollout.group_index == g]) > 0
    # 2 groups kept from the background batch + a fresh generation batch of 4 prompts.
    assert algo.fresh_calls == [4] and algo._sampling.dropped_stale_groups == 1
    assert logged["train/num_gen_batches"] == 2
    assert logged["filter_groups/discarded_surplus_groups"] == 2


# --------------------------------------------------------------------------- end to end
def test_max_staleness_0_is_the_synchronous_loop(ray_session):
    """At 0, `training_step` is sample -> update -> sync: the same weights, bit for bit, as
    that loop written out by hand on a second algorithm."""
    from rllib_grpo.rllib.algorithm.sampling import SynchronousSampling

    algo = tiny_config(lr=1e-2, max_staleness=0).build_algo()
    reference = tiny_config(lr=1e-2).build_algo()
    try:
        assert isinstance(algo._sampling, SynchronousSampling)
        for _ in range(2):
            algo.train()
        position = 0
        for _ in range(2):
            rollout = reference.env_runner.sample(num_prompts=4, start=position)
            position += 4
            reference.learner_group.update(batch=reference._to_learner_batch(rollout))
            reference._sync_weights()
        ours, theirs = _learner_state(algo), _learner_state(reference)
        assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    finally:
        algo.stop()
        reference.stop()


def test_staleness_1_trains_on_groups_one_update_old_never_more(ray_session):
    from rllib_grpo.cli.tensorboard import flatten

    algo = _remote(tiny_config(lr=1e-2, max_staleness=1)).build_algo()
    try:
        staleness, results = [], []
        for _ in range(4):
            results.append(flatten(algo.train()))
            learner_version = algo.learner_group._learner._weights_seq_no - 1  # at the update
            staleness.append(set((learner_version - algo.last_rollout.weights_version).tolist()))
            # The next step's groups are in flight while this step returns.
            assert algo._sampling._tag is not None
        # Step 1 has nothing sampled ahead; from step 2 on every group is one update old.
        assert staleness == [{0}, {1}, {1}, {1}]
        assert [r["async/staleness_max"] for r in results] == [0, 1, 1, 1]
        assert results[0]["training/rollout_log_probs_diff_max/staleness_0"] < 1e-4
        for r in results[1:]:
            assert "training/rollout_log_probs_diff_max/staleness_1" in r
            assert 0 <= r["async/learner_idle_frac"] <= 1
            assert 0 <= r["async/sampler_idle_frac"] <= 1
        assert max(r["training/rollout_log_probs_diff_max/staleness_1"]
                   for r in results[1:]) > 1e-3  # the policy moved between sample and update
    finally:
        algo.stop()


@pytest.mark.slow  # three algorithms with a remote env runner: ~1-2 min on 2 busy cores
def test_a_checkpoint_discards_in_flight_samples_and_restores_clean(ray_session, tmp_path):
    from rllib_grpo.cli.tensorboard import flatten
    from rllib_grpo.rllib.algorithm.grpo import DATA_POSITION, GRPO

    algo = _remote(tiny_config(lr=1e-2, max_staleness=1)).build_algo()
    try:
        for _ in range(4):
            algo.train()
        # A checkpoint holds no in-flight samples: its data position is where they begin.
        assert algo._data_position == 5 * 4  # 4 steps trained + 1 in flight, 4 prompts each
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        assert algo.get_state(components=DATA_POSITION)[DATA_POSITION] == 4 * 4
        algo.train()  # trains the groups that were in flight at the save
        in_flight_prompts = algo.last_rollout.prompt_ids.copy()
    finally:
        algo.stop()
    restored = GRPO.from_checkpoint(path)
    try:
        result = flatten(restored.train())
        # Restored clean: sampled now with the restored weights, the same prompts again.
        assert result["async/staleness_max"] == 0
        np.testing.assert_array_equal(restored.last_rollout.prompt_ids, in_flight_prompts)
    finally:
        restored.stop()


@pytest.mark.slow  # two FSDP2 learners and two remote env runners: ~1-2 min on 2 cores
def test_staleness_1_with_two_fsdp_learners_and_two_env_runners(ray_session):
    """The pipeline reads only learner 0's version and splits each request over the
    runners: with sharded learners and two runners every group is one update old from
    step 2 on, each runner samples its slice, and after `settle` both hold the learners'
    gathered weights exactly."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.cli.tensorboard import flatten
    from rllib_grpo.rllib.learner.fsdp import FSDPGRPOLearner

    config = tiny_config(lr=1e-2, max_staleness=1, rollout_is="token")
    config.env_runners(num_env_runners=2, num_cpus_per_env_runner=0,
                       create_local_env_runner=False)
    config.learners(num_learners=2, num_cpus_per_learner=1)
    config.resources(num_cpus_for_main_process=0)
    algo = config.build_algo()
    try:
        group = algo.learner_group
        assert all(group._get_results(group.foreach_learner(
            lambda learner: isinstance(learner, FSDPGRPOLearner))))
        results = [flatten(algo.train()) for _ in range(3)]
        assert [r["async/staleness_max"] for r in results] == [0, 1, 1]
        assert [r["async/staleness_mean"] for r in results] == [0, 1, 1]
        assert all("rollout_corr/is_weight_mean" in r for r in results)
        # Each step's 4 prompts came from both runners (2 each), one group per prompt.
        assert algo.last_rollout.num_groups == 4
        assert {1, 2} <= set(algo.runner_states)  # both runners returned their share
        algo._sampling.settle()  # take the request in flight; the runners get the newest
        learner_weights = group.get_weights()[DEFAULT_MODULE_ID]
        runner_weights = algo.env_runner_group.foreach_env_runner(
            lambda er: {k: v.detach().cpu() for k, v in er.sampler.model.state_dict().items()},
            local_env_runner=False)
        assert len(runner_weights) == 2
        for weights in runner_weights:
            for key, value in learner_weights.items():
                assert torch.equal(weights[key].float(), torch.as_tensor(value).float()), key
    finally:
        algo.stop()
