"""GRPOConfig: fields, verl aliases, batch plan and validation errors."""

from __future__ import annotations

import pytest

from tests.conftest import REPO_ROOT, tiny_config


def _errors(**training):
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(tiny_config(**training))


def test_defaults_follow_verl_grpo():
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    c = GRPOConfig()
    assert (c.adv_estimator, c.loss_agg_mode, c.kl_loss_type) == ("grpo", "token-mean", "low_var_kl")
    assert c.use_kl_loss and not c.use_kl_in_reward
    assert c.gamma == 1.0 and c.grad_clip == 1.0 and c.clip_ratio_c == 3.0


def test_verl_dotted_names_set_the_same_fields():
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    c = GRPOConfig().training(**{
        "actor_rollout_ref.rollout.n": 5,
        "data.train_batch_size": 10,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 5,
        "actor_rollout_ref.actor.optim.lr": 3e-6,
        "algorithm.adv_estimator": "rloo",
    })
    assert (c.group_size, c.prompts_per_step, c.prompts_per_minibatch) == (5, 10, 5)
    assert c.lr == 3e-6 and c.adv_estimator == "rloo"
    d = GRPOConfig().update_from_dict({"actor_rollout_ref.actor.use_kl_loss": False})
    assert d.use_kl_loss is False
    assert GRPOConfig().use_remove_padding is True  # verl's switch: on by default, honoured
    e = GRPOConfig().training(**{"actor_rollout_ref.model.use_remove_padding": False})
    assert e.use_remove_padding is False and e.module_config()["use_remove_padding"] is False


def test_batch_plan_units():
    plan = tiny_config(prompts_per_step=8, group_size=4, prompts_per_minibatch=2,
                       micro_batch_size_per_learner=2, num_epochs=2).batch_plan()
    assert plan.trajectories_per_step == 32
    assert plan.trajectories_per_minibatch == 8
    assert plan.micro_batches_per_minibatch == 4
    assert plan.optimizer_steps_per_step == 8  # 4 mini-batches x 2 epochs


def test_valid_config_has_no_errors():
    assert _errors() == []


@pytest.mark.parametrize("training, needle", [
    ({"group_size": 1}, "group_size=1"),
    ({"prompts_per_step": 4, "prompts_per_minibatch": 3}, "prompts_per_minibatch=3"),
    ({"micro_batch_size_per_learner": 3}, "micro_batch_size_per_learner=3"),
    ({"use_kl_in_reward": True, "use_kl_loss": True}, "use_kl_in_reward and use_kl_loss"),
    ({"adv_estimator": "gae2"}, "adv_estimator='gae2'"),
    ({"policy_loss": "nope"}, "policy_loss='nope'"),
    ({"loss_agg_mode": "mean"}, "loss_agg_mode='mean'"),
    ({"kl_loss_type": "k9"}, "kl_loss_type='k9'"),
    ({"temperature": 0.0}, "temperature=0.0"),
    ({"use_dynamic_bsz": True, "max_tokens_per_micro_batch": 10}, "max_tokens_per_micro_batch=10"),
    ({"clip_ratio_c": 1.0}, "clip_ratio_c=1.0"),
    ({"token_stats": "fast"}, "token_stats='fast'"),
])
def test_validation_names_field_and_fix(training, needle):
    errors = _errors(**training)
    assert any(needle in e for e in errors), errors


# Every choice-valued setting (units name / mode / dtype / names) with a misspelling of one
# of its values and that value; extra settings that switch the field's check on.
CHOICE_UNITS = ("name", "mode", "dtype", "names")
MISSPELT_CHOICES = {
    "truncation": ("midle", "middle", {}),
    "model_dtype": ("bfloat61", "bfloat16", {}),
    "master_weights_dtype": ("float23", "float32", {}),
    "sampler": ("vllmm", "vllm", {}),
    "adv_estimator": ("grpo_passs", "grpo_passk", {}),
    "kl_penalty": ("low_var_kll", "low_var_kl", {}),
    "kl_ctrl_type": ("adaptiv", "adaptive", {}),
    "kl_loss_type": ("lowvar_kl", "low_var_kl", {}),
    "policy_loss": ("vanila", "vanilla", {}),
    "loss_agg_mode": ("token_mean", "token-mean", {}),
    "filter_groups_metric": ("scor", "score", {"filter_groups": True}),
    "rollout_is": ("tokens", "token", {}),
    "lr_scheduler_type": ("cosin", "cosine", {}),
    "reward_model_dtype": ("bfloat61", "bfloat16", {}),
    "fsdp_param_dtype": ("bfloat61", "bfloat16", {}),
    "fsdp_reduce_dtype": ("float23", "float32", {}),
    "lora_sync": ("merge", "merged", {"lora_rank": 4}),
    "token_stats": ("chunkd", "chunked", {}),
    "weight_sync_transport": ("object_stor", "object_store", {}),
    "rollout_mode": ("continous", "continuous", {}),
    "loggers": ("tensorbord", "tensorboard", {}),
}


def test_every_choice_setting_refuses_a_misspelling_with_the_nearest_choice():
    """One mechanism (`settings.choice_error`) for every setting whose value is one of a
    list: the list, and the nearest choice."""
    from rllib_grpo.rllib.config.settings import SETTINGS_FIELDS

    choice_fields = {name for name, f in SETTINGS_FIELDS.items()
                     if f.metadata["unit"] in CHOICE_UNITS}
    assert set(MISSPELT_CHOICES) == choice_fields
    for field, (typo, meant, switches) in MISSPELT_CHOICES.items():
        value = (typo,) if field == "loggers" else typo
        errors = _errors(**{field: value, **switches})
        refusal = [e for e in errors if e.startswith(f"{field}={typo!r} is unknown; use one of:")]
        assert len(refusal) == 1 and f"Did you mean {meant!r}" in refusal[0], (
            field, errors)


def test_validate_raises_value_error():
    with pytest.raises(ValueError, match="group_size=1"):
        tiny_config(group_size=1).validate()


def test_both_kl_allowed_explicitly():
    assert _errors(use_kl_in_reward=True, use_kl_loss=True, allow_kl_in_reward_and_loss=True) == []


def test_uneven_learner_split_rejected():
    errors = _errors(prompts_per_step=3) + []
    assert errors == []  # one learner: anything goes
    from rllib_grpo.rllib.config.checks import find_errors

    c = tiny_config(prompts_per_step=3)
    c.num_learners = 2
    assert any("num_learners=2" in e for e in find_errors(c))


def test_fields_are_declared_for_type_checkers():
    import typing

    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.rllib.config.settings import SETTINGS_FIELDS, GRPOSettings

    assert issubclass(GRPOConfig, GRPOSettings)
    hints = typing.get_type_hints(GRPOSettings)
    assert set(SETTINGS_FIELDS) <= set(hints)
    c, d = GRPOConfig(), GRPOConfig().training(lr=1e-3)
    assert c != d or c is d  # RLlib's identity equality, not the settings dataclass's


def test_val_every_and_val_num_prompts_are_rllibs_evaluation_fields():
    """One value under two names: setting either name is read back under the other, in
    Python, through verl's key, in RLlib's evaluation copy and in a config dict."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.rllib.config.settings import WHOLE_HELD_OUT_SET

    c = GRPOConfig()
    assert (c.val_every, c.evaluation_interval) == (0, None)
    assert (c.val_num_prompts, c.evaluation_duration) == (None, WHOLE_HELD_OUT_SET)
    c.training(val_every=5, val_num_prompts=4)
    assert (c.evaluation_interval, c.evaluation_duration) == (5, 4)
    c.evaluation(evaluation_interval=3, evaluation_duration=7)
    assert (c.val_every, c.val_num_prompts) == (3, 7)
    assert c.get_evaluation_config_object().val_num_prompts == 7
    c.training(val_every=-1, val_num_prompts=None)  # verl's test_freq=-1: never
    assert (c.evaluation_interval, c.evaluation_duration) == (None, WHOLE_HELD_OUT_SET)
    assert GRPOConfig().training(**{"trainer.test_freq": 2}).evaluation_interval == 2
    d = GRPOConfig().update_from_dict({"val_every": 4, "val_num_prompts": 3})
    assert (d.evaluation_interval, d.evaluation_duration) == (4, 3)
    restored = GRPOConfig.from_state(d.get_state())
    assert (restored.val_every, restored.val_num_prompts) == (4, 3)


def test_the_command_line_takes_the_evaluation_aliases_and_checks_their_type():
    from rllib_grpo.cli.config_keys import translate
    from rllib_grpo.cli.errors import ConfigError

    assert translate({"trainer.test_freq": 5, "val_num_prompts": 3}, "GRPO", "x").config == {
        "val_every": 5, "val_num_prompts": 3}
    with pytest.raises(ConfigError, match="val_every='5': expected int"):
        translate({"val_every": "5"}, "GRPO", "x")


@pytest.mark.parametrize("name", ["weight_sync_bucket_mb", "peak_tflops",
                                  "warn_no_signal_after"])
def test_constants_are_no_settings(name):
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    with pytest.raises(TypeError, match=f"unknown setting '{name}'"):
        GRPOConfig().training(**{name: 1})


@pytest.mark.parametrize("field", ["train_batch_size", "train_batch_size_per_learner",
                                   "minibatch_size"])
def test_derived_fields_refused_from_python(field):
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    with pytest.raises(ValueError, match=f"'{field}' is derived for GRPO"):
        GRPOConfig().training(**{field: 64})


def test_train_batch_size_per_learner_set_directly_is_refused():
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    c = GRPOConfig().training(prompts_per_step=4, group_size=2)
    assert c.train_batch_size_per_learner == 8
    c.train_batch_size_per_learner = 8  # the derived value itself is harmless
    with pytest.raises(ValueError, match="prompts_per_step"):
        c.train_batch_size_per_learner = 64


def test_configuration_doc_is_generated_from_settings():

    from rllib_grpo.rllib.config.settings import (
        EVALUATION_ALIASES,
        SETTINGS_FIELDS,
        configuration_doc,
    )

    doc = REPO_ROOT / "docs" / "configuration.md"
    assert doc.read_text() == configuration_doc(), (
        "docs/configuration.md is stale: python -m rllib_grpo.rllib.config.settings > "
        "docs/configuration.md")
    assert all(f"| `{name}` |" in doc.read_text()
               for name in [*SETTINGS_FIELDS, *EVALUATION_ALIASES])


def test_token_stats_reaches_the_learners_module():
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    config = tiny_config(token_stats="chunked")
    assert config.module_config()["token_stats"] == "chunked"
    learner = config.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    assert learner.module[DEFAULT_MODULE_ID].unwrapped().token_stats == "chunked"


def test_classes_held_by_path_resolve_on_read_and_survive_rllib_s_copies():
    """`ClassByPath`: the algorithm and env runner classes stay import paths until read
    (GRPOConfig() does not import transformers); RLlib's copies, dicts and states, and a
    pickle to a worker, keep working with the path or the class."""
    import pickle

    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rllib_grpo.rllib.algorithm.grpo import GRPO
    from rllib_grpo.rllib.config.grpo_config import ALGORITHM, ENV_RUNNER, ClassByPath, GRPOConfig
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner

    config = GRPOConfig()
    assert ClassByPath.path(config, "env_runner_cls") == ENV_RUNNER
    assert ClassByPath.path(config, "algo_class") == ALGORITHM
    copied = pickle.loads(pickle.dumps(config.copy(copy_frozen=False)))
    assert ClassByPath.path(copied, "env_runner_cls") == ENV_RUNNER
    assert config.to_dict()["env_runner_cls"] == ENV_RUNNER
    assert "algo_class" not in config.get_state()
    assert config.algo_class is GRPO and config.env_runner_cls is TextEnvRunner
    assert ClassByPath.path(config, "algo_class") is None  # resolved once, kept
    assert copied.env_runner_cls is TextEnvRunner
    restored = AlgorithmConfig.from_state(config.get_state())
    assert restored.env_runner_cls is TextEnvRunner and restored.algo_class is GRPO

    class MyRunner(TextEnvRunner):
        pass

    assert GRPOConfig().env_runners(env_runner_cls=MyRunner).env_runner_cls is MyRunner
