"""GRPO end to end on the tiny model: one iteration, weight sync, checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.conftest import tiny_config

VERL_METRICS = (
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/max", "response_length/mean",
    "response_length/clip_ratio", "actor/pg_loss", "actor/pg_clipfrac", "actor/ppo_kl",
    "actor/kl_loss", "actor/entropy", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor",
    "timing_s/update_weights", "perf/throughput", "groups/zero_variance_frac",
    "groups/all_right_frac", "groups/all_wrong_frac", "training/rollout_probs_diff_max",
    # learner throughput (rllib_grpo.rllib.learner.perf); MFU with a configured peak on CPU
    "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_policy", "perf/actor_tokens_per_s",
    "perf/mfu/actor",
)


def _learner_state(algo) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return algo.learner_group._learner.module[DEFAULT_MODULE_ID].get_state()


def _flat(result: dict) -> dict:
    from rllib_grpo.cli.tensorboard import flatten

    return flatten(result)


def test_one_iteration_logs_verl_metrics_and_syncs_weights(ray_session, monkeypatch):
    # A peak for the CPU (known GPUs only have one), so that perf/mfu/actor is logged.
    monkeypatch.setattr("rllib_grpo.rllib.learner.learner.peak_flops", lambda device: 1e12)
    algo = tiny_config().build_algo()
    try:
        before = _learner_state(algo)
        result = _flat(algo.train())
        for key in VERL_METRICS:
            assert key in result or f"env_runners/{key}" in result, key
        assert result["env_runners/num_env_steps_sampled"] == 16  # 4 prompts x 4
        after = _learner_state(algo)
        assert any(not torch.equal(before[k], after[k]) for k in before)
        # The sampler holds the learner's new weights after the sync.
        sampler_state = algo.env_runner.sampler.model.state_dict()
        for key, value in after.items():
            assert torch.equal(sampler_state[key], value), key
        # ... so its log-probs and the learner's recomputed ones agree.
        result = _flat(algo.train())
        assert result["training/rollout_probs_diff_max"] < 1e-5
    finally:
        algo.stop()


def test_groups_share_a_prompt_and_rewards_match_info(ray_session):
    algo = tiny_config().build_algo()
    try:
        algo.train()
        rollout = algo.last_rollout
        for g in np.unique(rollout.group_index):
            rows = np.flatnonzero(rollout.group_index == g)
            assert len(rows) == 4
            assert len({tuple(rollout.prompt_ids[r]) for r in rows}) == 1
        assert [float(i["reward"]) for i in rollout.infos] == rollout.scores.tolist()
    finally:
        algo.stop()


@pytest.mark.parametrize("num_env_runners", [0, 1])
def test_checkpoint_round_trip_continues_identically(ray_session, tmp_path, num_env_runners):
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    # A warm-up still running at the checkpoint: the restored LR schedule must continue it.
    config = tiny_config(use_kl_in_reward=True, use_kl_loss=False, kl_ctrl_type="adaptive",
                         lr_warmup_steps=6)
    config.env_runners(num_env_runners=num_env_runners,
                       create_local_env_runner=num_env_runners == 0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))
        for _ in range(2):
            algo.train()
        uninterrupted = _learner_state(algo)
        kl_value = algo.learner_group._learner.kl_ctrl.value
    finally:
        algo.stop()

    restored = GRPO.from_checkpoint(path)
    try:
        assert restored.training_iteration == 2
        for _ in range(2):
            restored.train()
        resumed = _learner_state(restored)
        assert restored.learner_group._learner.kl_ctrl.value == pytest.approx(kl_value)
    finally:
        restored.stop()
    for key, value in uninterrupted.items():
        assert torch.equal(resumed[key], value), key


def test_truncated_importance_sampling_logs_weights(ray_session):
    algo = tiny_config(rollout_is="token", rollout_is_threshold=2.0).build_algo()
    try:
        result = _flat(algo.train())
        # Sampler and trainer agree in fp32, so the weights are ~1 and none truncated.
        assert abs(result["rollout_corr/is_weight_mean"] - 1.0) < 1e-4
        assert result["rollout_corr/is_truncated_frac"] == 0.0
    finally:
        algo.stop()


def test_a_new_learner_metric_in_a_verl_namespace_reaches_the_top_level(ray_session,
                                                                        monkeypatch):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.learner.learner import GRPOLearner
    from rllib_grpo.rllib.learner.perf import LEARNER_METRIC_NAMESPACES

    log_step_metrics = GRPOLearner._log_step_metrics

    def with_a_new_metric(self):
        self._log("actor/metric_on_no_list", 42.0)
        log_step_metrics(self)

    monkeypatch.setattr(GRPOLearner, "_log_step_metrics", with_a_new_metric)
    algo = tiny_config().build_algo()
    try:
        result = algo.train()
        assert result["actor/metric_on_no_list"] == 42.0
        learner = result["learners"][DEFAULT_MODULE_ID]
        namespaced = {k for k in learner if k.startswith(LEARNER_METRIC_NAMESPACES)}
        assert {"actor/pg_loss", "critic/advantages/max", "timing_s/update_policy"} <= namespaced
        assert all(result[k] == learner[k] for k in namespaced)  # every one, under its name
        assert "num_module_steps_trained" not in result  # RLlib's own stay under learners/
    finally:
        algo.stop()


def test_the_learner_logs_nothing_outside_the_surfaced_namespaces():
    from rllib_grpo.rllib.learner.perf import StepMetrics

    metrics = StepMetrics()
    metrics.add("rollout_corr/new_metric", 1.0)
    with pytest.raises(ValueError, match="LEARNER_METRIC_NAMESPACES"):
        metrics.add("pg_loss", 1.0)


def test_phase_timings_are_the_steps_own_values(ray_session):
    """``timing_s/sample`` is this step's seconds, not a moving average over steps: a slow
    first sample (0.5 s) must not show in the second step's value (RLlib's ``log_time`` kept
    an exponential average, which read ~0.5 s again)."""
    import time

    import psutil

    algo = tiny_config().build_algo()
    try:
        sample = algo.sampling.sample
        delays = iter([0.5, 0.0])

        def slow_then_fast(num_prompts):
            time.sleep(next(delays))
            return sample(num_prompts)

        algo.sampling.sample = slow_then_fast
        first = _flat(algo.train())
        second = _flat(algo.train())
        assert first["timing_s/sample"] >= 0.5
        assert second["timing_s/sample"] < first["timing_s/sample"] - 0.4
        assert second["timing_s/sample"] <= second["timing_s/step"]
        # Start-up: the first result says how long it took to reach the first step.
        assert 0 < first["timing_s/startup"] < time.time() - psutil.Process().create_time()
        assert not [key for key in first if key.startswith("timing_s/startup/")]
    finally:
        algo.stop()
