"""verl's data and validation behaviour: one prompt order per epoch shared by all env runners
(each serving its share), data.shuffle, files from data.train_files, test_freq and
val_before_train."""

from __future__ import annotations

import pytest

from tests.conftest import tiny_config


def test_prompt_slices_cover_each_position_once():
    from rllib_grpo.rllib.algorithm.sampling.prompt_order import prompt_slices

    assert prompt_slices(10, 5, 2) == [(10, 3), (13, 2)]
    assert prompt_slices(0, 2, 3) == [(0, 1), (1, 1), (2, 0)]


def test_env_runners_share_one_permutation_per_epoch_like_verls_dataloader():
    """Two runners' envs (same seed, same data) each serve their slice of the next step's
    positions: within an epoch every prompt comes exactly once, as from verl's sampler."""
    from rllib_grpo.envs.arithmetic import ArithmeticEnv
    from rllib_grpo.rllib.algorithm.sampling.prompt_order import prompt_slices

    runners = [ArithmeticEnv(num_problems=6, seed=3) for _ in range(2)]
    served, position = [], 0
    for _ in range(4):  # 4 steps x 3 prompts = 2 epochs of 6
        for env, (start, count) in zip(runners, prompt_slices(position, 3, 2), strict=True):
            env.seek(start)
            served += [env.reset()[1]["index"] for _ in range(count)]
        position += 3
    first, second = served[:6], served[6:]
    assert sorted(first) == sorted(second) == list(range(6))
    assert first != second  # a new permutation each epoch
    assert first == list(ArithmeticEnv(num_problems=6, seed=3)._permutation(0))


def test_data_shuffle_false_serves_the_files_order():
    from rllib_grpo.models import load_tokenizer, resolve_model
    from rllib_grpo.rllib.env_runner.env_runner import make_text_env

    config = tiny_config(data_shuffle=False)
    env = make_text_env(config, load_tokenizer(resolve_model(config.model_path)), seed=5)
    assert [env.reset()[1]["index"] for _ in range(4)] == [0, 1, 2, 3]


def test_verl_data_keys_and_validation_sampling_are_settings():
    config = tiny_config(**{"data.shuffle": False, "data.seed": 7,
                            "actor_rollout_ref.actor.data_loader_seed": 1,
                            "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
                            "actor_rollout_ref.rollout.val_kwargs.temperature": 0.6,
                            "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
                            "trainer.val_before_train": True})
    assert (config.data_shuffle, config.data_seed, config.minibatch_shuffle_seed) == (False, 7, 1)
    params = config.validation_sampling()
    assert (params.temperature, params.top_p, config.val_before_train) == (0.6, 0.7, True)
    greedy = tiny_config(val_do_sample=False, val_temperature=0.6).validation_sampling()
    assert greedy.temperature == 0.0  # verl: do_sample=False is greedy whatever the rest


def test_verl_test_freq_minus_one_never_validates_and_the_last_step_does():
    from rllib_grpo.rllib.algorithm.evaluation import evaluation_due

    def due(step, **settings):
        return evaluation_due(tiny_config(**settings), step)

    assert not any(due(step, val_every=-1) for step in range(1, 20))  # verl test_freq=-1
    assert [s for s in range(1, 8) if due(s, val_every=3)] == [3, 6]
    assert [s for s in range(1, 8) if due(s, val_every=3, total_training_steps=7)] == [3, 6, 7]


def test_train_files_list_and_home_are_read(tmp_path, monkeypatch):
    """verl's data.train_files may be a list and start with ~; the file env reads it."""
    import gymnasium

    from rllib_grpo.envs._file_env import fixture_path

    monkeypatch.setenv("HOME", str(tmp_path))
    rows = fixture_path("gsm8k_fixture.jsonl").read_text().splitlines()
    (tmp_path / "a.jsonl").write_text("\n".join(rows[:3]) + "\n")
    (tmp_path / "b.jsonl").write_text("\n".join(rows[3:5]) + "\n")
    env = gymnasium.make("rllib_grpo/Prompts-v0", path=["~/a.jsonl", "~/b.jsonl"],
                         seed=0).unwrapped
    assert env.num_prompts == 5
    env.reset(options={"index": 4})
    assert env.step(env.dataset[4].extra_info["answer"])[1] == 1.0  # gsm8k by data_source


def test_model_path_with_home_is_a_folder_not_a_hub_id(tmp_path, monkeypatch):
    from rllib_grpo.models.model_registry import resolve_model

    monkeypatch.setenv("HOME", str(tmp_path))
    assert resolve_model("~/models/qwen") == str(tmp_path / "models" / "qwen")


@pytest.mark.parametrize("env_config, needle", [
    ({"path": "x.jsonl"}, "For prompt files (verl's data.train_files"),
    ({"prompt_key": "question"}, "takes no such option"),
])
def test_file_options_on_an_env_without_files_are_an_error(env_config, needle):
    from rllib_grpo.rllib.config.checks import find_errors

    config = tiny_config()
    config.environment("rllib_grpo/Arithmetic-v0", env_config=env_config)
    assert any(needle in e for e in find_errors(config))


def _count_validations(algo):
    calls = []
    original = algo.validate

    def counted(*args):
        calls.append(algo.iteration)
        return original(*args)

    algo.validate = counted
    return calls


def test_val_before_train_then_every_test_freq_and_the_last_step(ray_session):
    algo = tiny_config(val_before_train=True, val_every=2, total_training_steps=3,
                       val_num_prompts=2).build_algo()
    try:
        calls = _count_validations(algo)
        for _ in range(3):
            algo.train()
        # before the first step; after step 2 (test_freq); after step 3 (the last)
        assert calls == [0, 1, 2]
    finally:
        algo.stop()


@pytest.mark.slow  # two remote env runners: 30-80 s on two shared cores
def test_two_env_runners_serve_each_prompt_once_per_epoch(ray_session):
    config = tiny_config(prompts_per_step=4, group_size=2)
    config.environment("rllib_grpo/Arithmetic-v0", env_config={"num_problems": 8,
                                                               "max_operand": 4})
    config.env_runners(num_env_runners=2, create_local_env_runner=False)
    algo = config.build_algo()
    try:
        served = []
        for _ in range(4):  # 2 epochs of 8 prompts
            algo.train()
            rollout = algo.last_rollout
            served += [rollout.infos[i]["index"] for i in range(0, len(rollout), 2)]
        assert sorted(served[:8]) == sorted(served[8:]) == list(range(8))
        assert algo.get_state()["data_position"] == 16
    finally:
        algo.stop()
