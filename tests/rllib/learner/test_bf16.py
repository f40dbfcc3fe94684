"""bf16 done as verl does it: fp32 master weights and AdamW states, bf16 compute, bf16 weights
on the samplers; checkpoints with bf16 anywhere; no-grad log-prob passes in eval mode.

* At verl's lr 1e-6, bf16 mode moves the weights like fp32 mode (pure-bf16 parameters would
  round ~98% of the updates away: measured 2% of the weights moved, relative difference 0.99).
* A bf16 run checkpoints and restores bit-exactly, with local or remote learner and env
  runner, and with pure-bf16 AdamW states too; training continues as if uninterrupted.
* With dropout, old log-probs are computed in eval mode (twice in a row: identical), the
  update in train mode, and the reference never leaves eval mode.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import REPO_ROOT, TESTS_DIR, tiny_config
from tests.helpers.learner_updates import fixed_batch


def _spaces():
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE

    return {DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)}


def _module(learner):
    from ray.rllib.core import DEFAULT_MODULE_ID

    return learner.module[DEFAULT_MODULE_ID].unwrapped()


def _update(learner, batch: dict[str, np.ndarray]):
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    return learner.update(batch=MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(batch)},
                                                len(batch["scores"])))


def _weight_change(model_dtype: str, master: str = "float32", steps: int = 3) -> torch.Tensor:
    """The flattened change of every policy weight after ``steps`` updates at lr 1e-6."""
    learner = tiny_config(prompts_per_step=2, group_size=4, lr=1e-6, model_dtype=model_dtype,
                          master_weights_dtype=master).build_learner(spaces=_spaces())
    lm = _module(learner).lm
    before = {k: v.double().clone() for k, v in lm.state_dict().items()}
    batch = fixed_batch(lm.config.vocab_size, pad=0)
    for _ in range(steps):
        _update(learner, batch)
    return torch.cat([(v.double() - before[k]).flatten() for k, v in lm.state_dict().items()])


def test_bf16_mode_moves_the_weights_like_fp32_mode():
    fp32 = _weight_change("float32")
    bf16 = _weight_change("bfloat16")
    assert (fp32 != 0).double().mean() > 0.99
    # Measured: relative difference 0.08, norm ratio 1.00 (pure bf16: 0.99 and 0.22).
    relative = ((bf16 - fp32).norm() / fp32.norm()).item()
    assert relative < 0.25, f"bf16 update differs from fp32 by {relative:.2f} (relative)"
    assert (bf16 != 0).double().mean() > 0.99


def test_pure_bf16_needs_its_own_setting_and_loses_most_updates():
    pure = _weight_change("bfloat16", master="bfloat16")
    assert (pure != 0).double().mean() < 0.2  # what model_dtype="bfloat16" used to do
    explained = tiny_config(model_dtype="bfloat16", master_weights_dtype="bfloat16").explain()
    assert "PITFALLS" in explained and "master_weights_dtype='bfloat16'" in explained
    assert "master_weights_dtype='bfloat16'" not in tiny_config(model_dtype="bfloat16").explain()
    with pytest.raises(ValueError, match="master_weights_dtype='bfloat16' with model_dtype"):
        tiny_config(master_weights_dtype="bfloat16").validate()
    with pytest.raises(ValueError, match="master_weights_dtype='half'"):
        tiny_config(master_weights_dtype="half").validate()


def test_dtypes_of_master_weights_optimizer_reference_and_weight_sync():
    learner = tiny_config(model_dtype="bfloat16", use_kl_loss=True).build_learner(
        spaces=_spaces())
    module = _module(learner)
    _update(learner, fixed_batch(module.lm.config.vocab_size, pad=0))
    assert {p.dtype for p in module.lm.parameters()} == {torch.float32}
    optim = next(iter(learner._named_optimizers.values()))
    moments = [s["exp_avg"] for s in optim.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}
    assert {p.dtype for p in module.ref_lm.parameters()} == {torch.bfloat16}
    synced = module.get_state(inference_only=True)
    assert {v.dtype for v in synced.values()} == {torch.bfloat16}
    assert {v.dtype for v in module.get_state().values()} == {torch.float32}  # checkpoints
    # The cast is round-to-nearest of the master weights, as the samplers load them.
    name, master = next(iter(module.lm.state_dict().items()))
    assert torch.equal(synced[name], master.to(torch.bfloat16))


def test_sampler_dtype_comes_from_sampler_config():
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner

    config = tiny_config(model_dtype="bfloat16", sampler_config={"dtype": "fp32"})
    assert config.sampler_dtype == "float32"
    runner = TextEnvRunner(config=config)  # was: "got multiple values for 'dtype'"
    assert runner.sampler.model.dtype == torch.float32
    assert tiny_config(model_dtype="bf16").model_dtype == "bfloat16"  # verl's spelling


def test_fsdp_mixed_precision_policy_follows_model_dtype():
    from rllib_grpo.rllib.learner.distributed import mixed_precision_policy

    cpu = torch.device("cpu")
    policy = mixed_precision_policy(tiny_config(model_dtype="bfloat16"), cpu)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert mixed_precision_policy(tiny_config(), cpu).param_dtype == torch.float32
    policy = mixed_precision_policy(tiny_config(fsdp_param_dtype="model"), cpu)
    assert policy.param_dtype is None  # the shards' own (master) dtype


def test_verl_precision_keys_map_with_verl_spellings():
    from rllib_grpo.cli.build import assemble, build_config
    from rllib_grpo.cli.experiment import ConfigError

    actor = "actor_rollout_ref.actor.fsdp_config."
    config = build_config(assemble(overrides=[
        f"{actor}model_dtype=fp32", f"{actor}mixed_precision.param_dtype=bf16",
        f"{actor}mixed_precision.reduce_dtype=fp32", f"{actor}mixed_precision.buffer_dtype=fp32",
        "actor_rollout_ref.rollout.dtype=bf16"]))
    assert (config.master_weights_dtype, config.model_dtype, config.fsdp_reduce_dtype) == (
        "float32", "bfloat16", "float32")
    assert config.sampler_dtype == "bfloat16" and config.sampler_config["dtype"] == "bfloat16"
    pure = build_config(assemble(overrides=[f"{actor}model_dtype=bf16", "model_dtype=bf16"]))
    assert pure.master_weights_dtype == "bfloat16" and "pure bf16" in pure.explain()
    with pytest.raises(ConfigError, match="buffer_dtype"):
        assemble(overrides=[f"{actor}mixed_precision.buffer_dtype=bf16"])


def test_compute_dtype_defaults_to_bf16_on_gpu_learners_and_for_verl_keys():
    """GPU learners and verl-key configurations compute in bf16 over fp32 master weights
    (verl's default); CPU runs keep float32 unless asked."""
    from rllib_grpo.cli.build import assemble, build_config

    def precision(config):
        line = next(x for x in config.explain().splitlines() if x.startswith("precision:"))
        return config.module_config()["dtype"], config.master_weights_dtype, line

    dtype, master, line = precision(tiny_config())
    assert (dtype, master) == ("float32", "float32") and "compute in float32" in line
    dtype, master, line = precision(tiny_config().learners(num_gpus_per_learner=1))
    assert (dtype, master) == ("bfloat16", "float32") and "compute in bfloat16" in line
    assert tiny_config().learners(num_gpus_per_learner=1).sampler_dtype == "bfloat16"
    asked = tiny_config(model_dtype="float32").learners(num_gpus_per_learner=1)
    assert precision(asked)[0] == "float32"  # asked: kept
    verl = build_config(assemble(overrides=["actor_rollout_ref.rollout.n=4",
                                            "data.train_batch_size=8"]))
    dtype, master, line = precision(verl)
    assert (dtype, master) == ("bfloat16", "float32") and "compute in float32" not in line


def test_memory_plan_counts_fp32_master_weights_and_bf16_compute():
    from rllib_grpo.models.shapes import model_shape
    from rllib_grpo.rllib.config.learner_memory import (
        activation_bytes,
        gathered_bytes,
        learner_states,
        micro_batch,
    )

    tiny = model_shape("builtin:tiny")
    n = tiny.num_params
    fp32, bf16 = tiny_config(), tiny_config(model_dtype="bfloat16")
    states = learner_states(bf16, tiny)
    assert states["weights"] == 4 * n and states["gradients"] == 4 * n
    assert states["AdamW"] == 8 * n
    assert states["reference"] == 2 * n  # frozen, forward only
    assert gathered_bytes(bf16, tiny, with_grads=True) == 2 * n  # autocast's cast weights
    assert gathered_bytes(fp32, tiny, with_grads=True) == 0
    # bf16 matmuls over an fp32 residual stream (autocast): less than fp32, more than half.
    full = activation_bytes(fp32, tiny, micro_batch(fp32, tiny), checkpointing=False)
    half = activation_bytes(bf16, tiny, micro_batch(bf16, tiny), checkpointing=False)
    assert full / 2 < half < full
    pure = tiny_config(model_dtype="bfloat16", master_weights_dtype="bfloat16")
    assert learner_states(pure, tiny)["AdamW"] == 4 * n
    assert gathered_bytes(pure, tiny, with_grads=True) == 0
    # FSDP2 all-gathers one unit at a time: the root (embeddings, norm) and ~2 decoder
    # layers, and in backward the root's and one layer's unsharded gradients.
    qwen05b = model_shape("Qwen/Qwen2.5-0.5B-Instruct")
    root = 151_936 * 896 + 896
    layer = (qwen05b.num_params - root) / 24
    sharded = tiny_config(model_dtype="bfloat16").learners(num_learners=2)
    assert gathered_bytes(sharded, qwen05b, with_grads=True) == pytest.approx(
        2 * (root + 2 * layer) + 2 * (root + layer))
    assert learner_states(sharded, qwen05b)["weights"] == 4 * qwen05b.num_params / 2


# --------------------------------------------------------------------------- eval mode
def _dropout_model_dir(folder: Path) -> str:
    from transformers import AutoConfig, AutoModelForCausalLM

    from rllib_grpo.models import build_char_tokenizer, save_model_dir

    tokenizer = build_char_tokenizer()
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        attention_dropout=0.5, tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    return save_model_dir(AutoModelForCausalLM.from_config(config), tokenizer, folder)


def test_old_log_probs_in_eval_mode_update_in_train_mode(tmp_path):
    from rllib_grpo.rllib.learner.learner import TENSOR_COLUMNS
    from rllib_grpo.rllib.learner.module import response_log_probs

    config = tiny_config(model_path=_dropout_model_dir(tmp_path / "dropout"), prompts_per_step=2,
                         group_size=4, use_kl_loss=True, skip_old_log_prob_pass=False)
    learner = config.build_learner(spaces=_spaces())
    module = _module(learner)
    batch = fixed_batch(module.lm.config.vocab_size, pad=0)
    tensors = {k: torch.as_tensor(v) for k, v in batch.items() if k in TENSOR_COLUMNS}
    passes = []  # (train mode, gradients on) of every policy forward
    module.lm.register_forward_pre_hook(
        lambda m, args: passes.append((m.training, torch.is_grad_enabled())))

    _update(learner, batch)  # RLlib's forward_train leaves the module in train mode
    first = learner._prepare(dict(tensors))["old_log_probs"]
    second = learner._prepare(dict(tensors))["old_log_probs"]
    assert torch.equal(first, second)
    assert passes and all(training == grad for training, grad in passes), passes
    assert (True, True) in passes  # the update itself ran in train mode
    assert not module.ref_lm.training
    # ... and the model's dropout is real: two train-mode forwards differ.
    module.lm.train()
    with torch.no_grad():
        a, b = (response_log_probs(module.lm, tensors, 1.0)["log_probs"] for _ in range(2))
    assert not torch.equal(a, b)


# --------------------------------------------------------------------------- checkpoints
def _policy_state(algo) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(v) for k, v in
            next(iter(algo.learner_group.get_weights().values())).items()}


def _optimizer_state(algo) -> dict:
    state = algo.learner_group.get_state(components="learner/optimizer")["learner"]["optimizer"]
    return next(iter(state.values()))["state"]["state"]


def _assert_bit_equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        x, y = a[key], b[key]
        if isinstance(x, dict):
            _assert_bit_equal(x, y)
        else:
            x, y = torch.as_tensor(x), torch.as_tensor(y)
            assert x.dtype == y.dtype and torch.equal(x, y), key


def _round_trip(tmp_path, remote: int, master: str = "float32") -> None:
    from rllib_grpo.rllib.algorithm.grpo import GRPO

    config = tiny_config(model_dtype="bfloat16", master_weights_dtype=master, lr=1e-4)
    if remote:
        config.learners(num_learners=1, num_cpus_per_learner=1)
        config.env_runners(num_env_runners=1, num_cpus_per_env_runner=1,
                           create_local_env_runner=False)
        config.resources(num_cpus_for_main_process=0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
        path = algo.save_to_path(str(tmp_path / "ckpt"))  # was: unsupported ScalarType BFloat16
        saved_weights, saved_optim = _policy_state(algo), _optimizer_state(algo)
        for _ in range(2):
            algo.train()
        uninterrupted = _policy_state(algo)
    finally:
        algo.stop()
    assert {v.dtype for v in saved_weights.values()} == {getattr(torch, master)}
    moments = {torch.as_tensor(s["exp_avg"]).dtype for s in saved_optim.values()}
    assert moments == {getattr(torch, master)}

    restored = GRPO.from_checkpoint(path)
    try:
        assert restored.training_iteration == 2
        _assert_bit_equal(_policy_state(restored), saved_weights)
        _assert_bit_equal(_optimizer_state(restored), saved_optim)
        for _ in range(2):
            restored.train()
        _assert_bit_equal(_policy_state(restored), uninterrupted)
    finally:
        restored.stop()


@pytest.mark.parametrize("master", ["float32", "bfloat16"])
def test_bf16_checkpoint_round_trip_local(ray_session, tmp_path, master):
    _round_trip(tmp_path, remote=0, master=master)


@pytest.mark.slow
def test_bf16_checkpoint_round_trip_remote_learner_and_env_runner(ray_session, tmp_path):
    _round_trip(tmp_path, remote=1)


# --------------------------------------------------------------------------- the GPU script
@pytest.mark.slow
def test_gpu_check_script_runs_on_cpu_with_a_tiny_model(tmp_path):
    script = TESTS_DIR / "gpu" / "gpu_grpo_check.py"
    root = str(REPO_ROOT)
    out = subprocess.run(
        [sys.executable, str(script), "--tiny", "--work-dir", str(tmp_path)], cwd=tmp_path,
        capture_output=True, text=True, timeout=1500,
        env={**os.environ, "PYTHONPATH": root})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for figure in ('"train_tokens_per_s"', '"mfu"', '"weight_sync_s"', '"weight_sync_bytes"',
                   '"checkpoint_bit_exact": true', '"phase": "remote"', '"phase": "async"',
                   '"async_vs_sync_throughput": ', '"ok": true'):
        assert figure in out.stdout, figure


@pytest.mark.parametrize("model_dtype", ["float32", "bfloat16"])
def test_the_reference_is_the_loaded_policy_copied_where_their_dtypes_match(
        model_dtype, monkeypatch):
    """fp32: the reference is a copy of the policy just loaded (one load from disk, not
    two), equal bit for bit and sharing no storage; bf16 compute over fp32 master weights:
    loaded in bf16 from the folder."""
    from rllib_grpo.models import loading
    from rllib_grpo.rllib.learner import module as module_file

    loads: list[str] = []
    real_load = loading.load_causal_lm

    def counting_load(path, **kwargs):
        loads.append(str(kwargs.get("dtype")))
        return real_load(path, **kwargs)

    monkeypatch.setattr(module_file, "load_causal_lm", counting_load)
    learner = tiny_config(use_kl_loss=True, model_dtype=model_dtype).build_learner(
        spaces=_spaces())
    module = _module(learner)
    policy, ref = module.lm, module.ref_lm
    fresh = real_load(policy.name_or_path, dtype=model_dtype)
    assert loads == (["float32"] if model_dtype == "float32" else ["float32", "bfloat16"])
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())
    fresh_state = fresh.state_dict()
    for name, tensor in ref.state_dict().items():
        assert tensor.dtype == getattr(torch, model_dtype)
        assert torch.equal(tensor, fresh_state[name]), name
    policy_storages = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    assert not policy_storages & {p.untyped_storage().data_ptr() for p in ref.parameters()}
