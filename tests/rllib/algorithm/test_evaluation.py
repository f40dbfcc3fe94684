"""GRPO's validation as RLlib's evaluation: `config.evaluation(...)`, `algo.evaluate()`,
``result["evaluation"]``, the held-out set scored once, and `algo.get_module()`."""

from __future__ import annotations

from ray.rllib.core.rl_module.rl_module import RLModule

from tests.conftest import tiny_config

HELD_OUT = {"max_operand": 4, "num_problems": 5}  # 5 held-out prompts
MEAN = "val-core/arithmetic/acc/mean@1"


def _config(**training):
    return tiny_config(**training).environment("rllib_grpo/Arithmetic-v0", env_config=HELD_OUT)


def test_evaluation_interval_puts_validation_under_result_evaluation(ray_session):
    config = _config().evaluation(evaluation_interval=1)
    algo = config.build_algo()
    try:
        result = algo.train()
        evaluation = result["evaluation"]
        assert 0.0 <= evaluation[MEAN] <= 1.0
        assert "val-core/arithmetic/acc/pass@1/mean" in evaluation
        assert result[MEAN] == evaluation[MEAN]  # verl's name at verl's place too
    finally:
        algo.stop()


def test_evaluate_scores_the_whole_held_out_set_once_with_n_in_the_names(ray_session):
    """5 held-out prompts, val_num_prompts=32, val_n=1: each prompt once, ``mean@1``."""
    algo = _config(val_num_prompts=32).build_algo()
    try:
        scored = []
        runner = algo.env_runner_group.local_env_runner
        original = runner.evaluate

        def recording(num_prompts, n, params, start=None):
            samples = original(num_prompts, n, params, start=start)
            scored.extend(s.prompt_index for s in samples)
            return samples

        runner.evaluate = recording
        metrics = algo.evaluate()
        assert MEAN in metrics and not any("mean@6" in k for k in metrics)
        assert sorted(scored) == sorted(set(scored)) and len(scored) == 5
    finally:
        algo.stop()


def test_evaluation_duration_counts_prompts_and_evaluation_config_sets_n(ray_session):
    config = _config().evaluation(evaluation_duration=2,
                                  evaluation_config={"val_n": 3, "val_temperature": 1.0})
    algo = config.build_algo()
    try:
        metrics = algo.evaluate()
        assert "val-core/arithmetic/acc/mean@3" in metrics
        assert "val-core/arithmetic/acc/pass@2/mean" in metrics
    finally:
        algo.stop()


def test_get_module_returns_the_learners_rl_module(ray_session):
    algo = tiny_config().build_algo()
    try:
        module = algo.get_module()
        assert isinstance(module, RLModule)
        assert module is algo.learner_group._learner.module["default_policy"]
    finally:
        algo.stop()
