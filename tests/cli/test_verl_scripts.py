"""verl's own launch scripts (tests/fixtures/verl, run by bash with recording fakes) pass
``rllib-grpo explain`` with verl's plan; parallel layouts that cannot run here (Ulysses,
Megatron) are refused with the reason and the nearest setting.  A configuration in verl's
keys starts from verl's defaults."""

from __future__ import annotations

import pytest

from rllib_grpo.cli.build import assemble, build_config
from rllib_grpo.cli.main import main
from tests.helpers.verl_scripts import FAKE_HOME, script_overrides


@pytest.fixture(autouse=True)
def no_model_builds(monkeypatch):
    """The plans and key mappings tested here do not depend on the memory plan, which
    tests/rllib/config/test_memory_plan.py tests (verl's Qwen3-8B line's included)."""
    from rllib_grpo.rllib.config import learner_memory

    def unavailable(*args, **kwargs):
        raise RuntimeError("model shape not read in these tests")

    monkeypatch.setattr(learner_memory, "config_shape", unavailable)


@pytest.fixture(autouse=True)
def models_and_data_exist(monkeypatch):
    """verl's scripts name Hub models and data files on their authors' machines: their
    existence checks (tests/rllib/config/test_input_checks.py) would be the only errors."""
    from rllib_grpo.rllib.config import checks

    monkeypatch.setattr(checks, "input_errors", checks.range_errors)


def _explain(args, capsys):
    code = main(["explain", *args], prog="rllib-grpo")
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _verl_plan(train_batch_size, n, mini_batch_size, gpus, epochs=1):
    """verl's numbers: trajectories, optimizer steps, per-GPU mini-batch (trajectories)."""
    return {"trajectories_per_step": train_batch_size * n,
            "optimizer_steps_per_step": train_batch_size // mini_batch_size * epochs,
            "trajectories_per_minibatch_per_learner": mini_batch_size * n // gpus}


# script -> (the script's own values, read from it: verl's plan and settings)
SCRIPTS = {
    "run_qwen3_8b_fsdp.sh": dict(
        plan=_verl_plan(1024, 5, 256, 8), micro_batches_by_tokens=True,
        max_tokens_per_micro_batch=24576, max_prompt_length=1024, max_response_length=2048,
        use_kl_loss=True, kl_loss_type="low_var_kl", kl_loss_coef=0.001, lr=1e-6,
        val_every=5, tensor_parallel_size=2, sampler_memory_fraction=0.6,
        ref_param_offload=True, fsdp_cpu_offload=False, num_learners=8),
    "run_qwen3_4b_fsdp.sh": dict(
        plan=_verl_plan(512, 5, 256, 8), micro_batches_by_tokens=True, max_tokens_per_micro_batch=3000,
        use_kl_loss=True, tensor_parallel_size=2, enable_chunked_prefill=False, val_every=5),
    "run_qwen3-8b.sh": dict(
        plan=_verl_plan(1024, 5, 256, 8), micro_batches_by_tokens=False,
        micro_batch_size_per_learner=32, max_prompt_length=512, max_response_length=1024,
        use_kl_loss=True, tensor_parallel_size=2, val_every=5),
    "run_qwen2-7b_math.sh": dict(
        plan=_verl_plan(1024, 5, 256, 8), micro_batch_size_per_learner=16,
        train_files=[f"{FAKE_HOME}/data/gsm8k/train.parquet",
                     f"{FAKE_HOME}/data/math/train.parquet"]),
    # DAPO, without the Ulysses keys (refused below; 1 is the nearest setting), on one node
    # (its 16 nodes with rollout TP 4: below).
    "run_dapo_qwen2.5_32b.sh": dict(
        env={"NNODES": "1"}, plan=_verl_plan(512, 16, 32, 8), use_kl_loss=False, use_kl_in_reward=False,
        clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=10.0, filter_groups=True,
        filter_groups_metric="acc", max_num_gen_batches=10, gen_prompts_per_batch=1536,
        overlong_buffer_enable=True, overlong_buffer_len=4096, overlong_penalty_factor=1.0,
        max_response_length=20480, max_tokens_per_micro_batch=22528, lr_warmup_steps=10,
        weight_decay=0.1, truncation="left", val_do_sample=True, val_top_p=0.7,
        val_temperature=1.0, val_before_train=True, tensor_parallel_size=4,
        enable_chunked_prefill=True, max_num_batched_tokens=22528, fsdp_cpu_offload=True,
        optimizer_offload=True, recorded={"reward_model.reward_manager": "dapo",
                                          "trainer.resume_mode": "auto"}),
    "test_dapo_7b_math.sh": dict(  # on one node, as above (it has 8 with rollout TP 4)
        env={"NNODES": "1"}, plan=_verl_plan(512, 16, 32, 8), filter_groups=False, overlong_buffer_enable=True,
        overlong_buffer_len=4096, overlong_penalty_factor=1.0, max_response_length=8192,
        model_override_config={"max_position_embeddings": 32768}, prompt_key="prompt",
        stop={"training_iteration": 200}, total_training_steps=200),
    # Qwen2.5-VL on Geo3K: data.image_key=images (tests/cli/test_verl_vision.py runs it).
    "run_qwen2_5_vl-7b.sh": dict(
        plan=_verl_plan(512, 5, 128, 8), micro_batch_size_per_learner=10, use_kl_loss=True,
        kl_loss_type="low_var_kl", kl_loss_coef=0.01, max_prompt_length=1024,
        max_response_length=2048, filter_overlong_prompts=True, tensor_parallel_size=2,
        sampler_memory_fraction=0.6, ref_param_offload=True, gradient_checkpointing=True,
        image_key="images", enable_chunked_prefill=False),
}
SAMPLER_KEYS = ("tensor_parallel_size", "enable_chunked_prefill", "max_num_batched_tokens")
# Pitfalls a verl script may show that are the same no-op in verl.
ALLOWED_PITFALLS = ("ref_param_offload=True does nothing: no KL term is on",)


def _without_ulysses(args):
    return [a for a in args if "ulysses_sequence_parallel_size" not in a]


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_verl_script_explains_with_verls_plan(name, tmp_path, capsys):
    expected = dict(SCRIPTS[name])
    _, args = script_overrides(name, tmp_path, expected.pop("env", None))
    args = _without_ulysses(args)
    code, out, err = _explain(args, capsys)
    assert "ERRORS:" not in out and not err, out + err
    pitfalls = [line for line in out.splitlines() if line.startswith("  - ")]
    assert all(any(p in line for p in ALLOWED_PITFALLS) for line in pitfalls), pitfalls
    assert code == (1 if pitfalls else 0)
    assert "defaults: verl's" in out

    exp = assemble(overrides=args)
    config = build_config(exp)
    plan = expected.pop("plan")
    assert {k: getattr(config.batch_plan(), k) for k in plan} == plan
    for key in SAMPLER_KEYS:
        if key in expected:
            assert config.sampler_config[key] == expected.pop(key), key
    if "train_files" in expected:
        assert config.env_config["path"] == expected.pop("train_files")
    for key in ("prompt_key", "image_key"):
        if key in expected:
            assert config.env_config[key] == expected.pop(key)
    for key in ("recorded", "stop"):
        if key in expected:
            assert getattr(exp, key) == expected.pop(key), key
    assert {k: getattr(config, k) for k in expected} == expected
    assert config.env == "rllib_grpo/Prompts-v0"  # data.train_files: verl's data files


@pytest.mark.parametrize("name, why", [
    ("run_dapo_qwen2.5_32b.sh", "Ulysses sequence parallelism"),
    ("test_dapo_7b_math.sh", "Ulysses sequence parallelism"),
    ("run_qwen3_8b_megatron.sh", "Megatron engine"),
])
def test_parallel_layouts_that_cannot_run_are_refused_with_the_nearest_setting(
        name, why, tmp_path, capsys):
    _, args = script_overrides(name, tmp_path)
    code, _, err = _explain(args, capsys)
    assert code == 2 and why in err and "Nearest setting that runs:" in err, err


def test_colocated_tp_engines_over_several_nodes_explain_with_verls_per_node_layout(
        tmp_path, capsys):
    """DAPO's 16 nodes x 8 GPUs with rollout TP 4: verl's layout, every TP group inside one
    node (the placement plan tiles each node's GPUs)."""
    _, args = script_overrides("run_dapo_qwen2.5_32b.sh", tmp_path)
    code, out, err = _explain(_without_ulysses(args), capsys)
    assert "ERRORS:" not in out and not err, out + err
    assert "128 GPU(s) on 16 node(s) of 8:" in out
    assert "     15    7  rank 127   engine 32 shard 3" in out


def test_a_configuration_in_verl_keys_starts_from_verls_defaults(capsys):
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    args = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=512", "trainer.total_training_steps=3"]
    config = build_config(assemble(overrides=args))
    # verl: no KL loss, mini-batches of 256 prompts, unlimited generation batches, ...
    assert (config.use_kl_loss, config.prompts_per_minibatch, config.max_num_gen_batches) == (
        False, 256, 0)
    assert (config.val_before_train, config.lr_warmup_steps, config.val_do_sample) == (
        True, -1, False)
    assert build_config(assemble(overrides=args[:1])).group_size == 1  # verl's rollout.n
    assert assemble(overrides=args[:3]).total_epochs == 30  # verl's total_epochs
    code, out, _ = _explain(args, capsys)
    assert "defaults: verl's" in out and "actor_rollout_ref.actor.use_kl_loss=False" in out
    assert "algorithm.adv_estimator=gae" in out  # the one verl default not taken, and why
    # This package's own defaults stay for GRPOConfig() and for files in its shape.
    ours = GRPOConfig()
    assert (ours.use_kl_loss, ours.group_size, ours.max_num_gen_batches) == (True, 8, 10)
    assert ours.prompts_per_minibatch is None and not ours.val_before_train


def test_a_file_in_our_shape_keeps_our_defaults_under_verl_overrides(tmp_path, capsys):
    path = tmp_path / "ours.yaml"
    path.write_text("exp:\n  config: {prompts_per_step: 8}\n")
    exp = assemble(str(path), ["actor_rollout_ref.rollout.n=4"])
    assert not exp.verl_defaults and build_config(exp).use_kl_loss is True
    verl_shaped = tmp_path / "verl.yaml"
    verl_shaped.write_text("data: {train_batch_size: 8}\nactor_rollout_ref: {rollout: {n: 4}}\n")
    assert build_config(assemble(str(verl_shaped))).use_kl_loss is False


@pytest.mark.parametrize("overrides, needle", [
    (["reward_model.reward_manager=naive", "reward_model.overlong_buffer.enable=True",
      "reward_model.overlong_buffer.len=4"], "reward_manager=naive has no overlong buffer"),
    (["reward_model.reward_kwargs.max_resp_len=100", "data.max_response_length=200"],
     "max_resp_len=100 differs from max_response_length=200"),
    (["reward_model.reward_manager=batch"], "use one of naive, dapo, prime"),
])
def test_verl_reward_manager_keys_are_checked_across_keys(overrides, needle):
    from rllib_grpo.cli.experiment import ConfigError

    with pytest.raises(ConfigError, match=needle):
        assemble(overrides=overrides)


def test_verl_overlong_buffer_enable_false_turns_shaping_off():
    base = ["reward_model.overlong_buffer.len=4", "data.max_response_length=8"]
    on = build_config(assemble(overrides=[*base, "reward_model.overlong_buffer.enable=True",
                                          "reward_model.overlong_buffer.penalty_factor=1.0"]))
    off = build_config(assemble(overrides=base))  # verl's default: enable=False
    assert on.overlong_buffer_enable is True and off.overlong_buffer_enable is False
    assert "overlong shaping:" in on.explain() and "overlong shaping:" not in off.explain()


def test_model_override_config_reaches_the_learners_model(tmp_path):
    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.loading import load_causal_lm
    from tests.conftest import tiny_config

    config = tiny_config(model_override_config={"max_position_embeddings": 256})
    overrides = config.module_config()["config_overrides"]
    assert overrides == {"max_position_embeddings": 256}
    lm = load_causal_lm(resolve_model(config.model_path), config_overrides=overrides)
    assert lm.config.max_position_embeddings == 256


def test_verls_qwen3_8b_script_runs_verls_colocated_layout(tmp_path, capsys):
    """8 GPUs, rollout TP 2: 8 learners and 4 engines of TP 2 on the same GPUs, asleep
    during the update (issue 27), not one local env runner on a 2-GPU bundle."""
    _, args = script_overrides("run_qwen3-8b.sh", tmp_path)
    code, out, err = _explain(args, capsys)
    assert "ERRORS:" not in out and not err, out + err
    assert "8 learner(s) on 8 GPU(s), one each; 4 vLLM engine(s) of tensor parallel 2 " \
           "colocated on the same GPUs (verl's layout), asleep during the update" in out
    assert "memory per GPU:                sampling: the engine takes 60%" in out
    config = build_config(assemble(overrides=args))
    assert (config.num_learners, config.num_env_runners) == (8, 4)
    assert config.sampler_sleeps and not config.create_local_env_runner
