"""verl's colocated layout: N GPUs and rollout TP t are N learners and N/t engines of TP t
on the same GPUs, asleep during the update."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config


def test_eight_gpus_and_tp_two_are_four_engines_colocated_with_eight_learners():
    from rllib_grpo.rllib.config.gpu_layout import colocated_layout

    layout = colocated_layout(8, 2, sampler_memory_fraction=0.6)
    assert (layout.num_learners, layout.num_engines, layout.engine_tp) == (8, 4, 2)
    assert layout.colocated and layout.sampler_memory_fraction == 0.6
    # One learner and at most one engine's runner per GPU: the learner takes more than half.
    assert 0.5 < layout.gpus_per_learner < 1
    assert layout.gpus_per_learner + layout.gpus_per_env_runner == 1
    assert layout.settings()["create_local_env_runner"] is False
    with pytest.raises(ValueError, match="multiple of the rollout TP"):
        colocated_layout(6, 4)


def _colocated(num_gpus=8, tp=2, **training):
    config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp},
                         prompts_per_step=8, **training)
    return config.colocate(num_gpus)


def test_grpo_config_colocate_gives_the_layout_sleeping_engines_and_no_errors():
    from rllib_grpo.rllib.config.checks import find_errors
    from rllib_grpo.rllib.config.gpu_layout import layout_of
    from rllib_grpo.rllib.env_runner.env_runner import engine_options

    config = _colocated()
    layout = layout_of(config)
    assert (config.num_learners, config.num_env_runners, layout.engine_tp) == (8, 4, 2)
    assert layout.colocated and config.sampler_sleeps
    assert find_errors(config) == []
    options = engine_options(config)
    assert options["enable_sleep_mode"] and options["gpu_memory_utilization"] == 0.5
    text = config.explain()
    assert "8 learner(s) on 8 GPU(s), one each; 4 vLLM engine(s) of tensor parallel 2 " \
           "colocated" in text
    assert "memory per GPU:" in text and "the engine takes 50%" in text
    assert "ERRORS:" not in text


def test_colocated_engines_that_do_not_cover_the_gpus_or_cannot_sleep_are_errors():
    from rllib_grpo.rllib.config.checks import find_errors

    short = _colocated().env_runners(num_env_runners=2)
    assert any("set num_env_runners=4" in e for e in find_errors(short))
    pipelined = _colocated(max_staleness=1)
    assert any("engines sleep during the update" in e for e in find_errors(pipelined))
    # Learners at half a GPU or less can share one: still refused.
    halves = _colocated().learners(num_gpus_per_learner=0.5)
    assert any("two learners could land on one GPU" in e for e in find_errors(halves))


@pytest.mark.parametrize("runners,explicit,expected", [
    (0, None, True), (2, None, False), (2, True, True), (0, True, True), (2, False, False)])
def test_the_driver_holds_an_env_runner_only_where_no_remote_one_samples(runners, explicit,
                                                                          expected):
    from rllib_grpo import GRPOConfig

    config = GRPOConfig().env_runners(num_env_runners=runners)
    if explicit is not None:
        config.env_runners(create_local_env_runner=explicit)
    assert config.create_local_env_runner is expected
    # Unset travels as unset: through RLlib's dict (Tune, `rllib train`) and pickling.
    again = GRPOConfig().update_from_dict(config.to_dict())
    assert vars(again)["create_local_env_runner"] is explicit
    assert again.create_local_env_runner is expected


def test_an_evaluation_copy_decides_with_its_own_env_runners():
    from rllib_grpo import GRPOConfig

    config = GRPOConfig().env_runners(num_env_runners=2)
    assert config.get_evaluation_config_object().create_local_env_runner is True  # 0 eval runners
    config.evaluation(evaluation_num_env_runners=1)
    assert config.get_evaluation_config_object().create_local_env_runner is False


def test_no_env_runner_at_all_is_refused_and_an_idle_one_is_a_pitfall():
    from rllib_grpo import GRPOConfig
    from rllib_grpo.rllib.config.checks import find_pitfalls

    with pytest.raises(ValueError, match="create_local_env_runner=False with num_env_runners=0"):
        GRPOConfig().env_runners(create_local_env_runner=False).validate()
    idle = GRPOConfig().env_runners(num_env_runners=1, create_local_env_runner=True)
    assert any("create_local_env_runner=True with num_env_runners=1" in p
               for p in find_pitfalls(idle))
    assert not any("create_local_env_runner" in p
                   for p in find_pitfalls(GRPOConfig().env_runners(num_env_runners=1)))
