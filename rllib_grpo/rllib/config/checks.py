"""Every check of a GRPO configuration before anything starts, each error one line naming
the field and the fix.

`find_errors` lists settings that cannot run (`GRPOConfig.validate`, `explain` and
`rllib train` refuse the same inputs); `find_pitfalls` lists settings that run but probably
not as intended (printed by `explain`).  By concern, top to bottom: the settings' consistency
(names, sizes, algorithm, recipes, LoRA and memory, precision, learning-rate schedule, env
and sampler, multi-turn); numeric ranges (`range_errors`); the model and the data files
(`resource_errors`); and the door's checks that load something small (`count_errors`,
`env_id_error`, `reward_fn_errors`: the user's reward function called once in a child
process, `rllib_grpo.rewards.probe`; `logger_errors` with MLflow's store).  The reward,
vision, staleness, prompt-length and memory plans keep their own checks beside their plans.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from rllib_grpo.algos import ADV_ESTIMATORS, AGG_MODES, KL_CONTROLLERS, POLICY_LOSSES, kl_kinds
from rllib_grpo.algos.advantages import needs_groups
from rllib_grpo.algos.lr_schedule import LR_SCHEDULER_TYPES, needs_total_steps
from rllib_grpo.algos.policy_losses import forced_agg_mode
from rllib_grpo.algos.rollout_is import ROLLOUT_IS_LEVELS
from rllib_grpo.data.recipes import FILTER_METRICS
from rllib_grpo.envs.datasets import TRUNCATION_MODES
from rllib_grpo.envs.prompt_files import prompt_file_error
from rllib_grpo.envs.text import TextEnv, env_options
from rllib_grpo.models.lm_head import TOKEN_STATS_MODES
from rllib_grpo.models.lora import LORA_SYNC_MODES
from rllib_grpo.models.model_registry import model_path_error
from rllib_grpo.rllib.config.gpu_layout import (
    layout_errors,
    local_env_runner_pitfalls,
    planned_transports,
    tensor_parallel_size,
    unplaceable,
)
from rllib_grpo.rllib.config.prompt_lengths import prompt_length_errors
from rllib_grpo.rllib.config.reward_plan import reward_plan_errors
from rllib_grpo.rllib.config.settings import (
    LOGGER_PACKAGES,
    GRPOSettings,
    choice_error,
    did_you_mean,
)
from rllib_grpo.rllib.config.staleness import async_errors, async_pitfalls
from rllib_grpo.rllib.config.text_env import env_class
from rllib_grpo.rllib.config.vision_plan import vision_errors
from rllib_grpo.samplers import SAMPLER_KINDS
from rllib_grpo.weights.plan import WEIGHT_SYNC_TRANSPORTS

# ----------------------------------------------------------------------------
# The settings' consistency
# ----------------------------------------------------------------------------

def _is_group_estimator(c: GRPOSettings) -> bool:
    return c.adv_estimator in ADV_ESTIMATORS and needs_groups(c.adv_estimator)


# The KL estimators as the error lists them (aliases paired; every one also with '+').
KL_LISTED = "kl/k1, abs, mse/k2, low_var_kl/k3, or any of them with a '+' suffix"


def _check_names(c: GRPOSettings) -> list[str]:
    errors = []
    named = [
        ("adv_estimator", c.adv_estimator, ADV_ESTIMATORS.names()),
        ("policy_loss", c.policy_loss, POLICY_LOSSES.names()),
        ("loss_agg_mode", c.loss_agg_mode, tuple(AGG_MODES)),
        ("truncation", c.truncation, TRUNCATION_MODES),
        ("sampler", c.sampler, SAMPLER_KINDS),
        ("kl_ctrl_type", c.kl_ctrl_type, KL_CONTROLLERS.names()),
    ]
    named += [(field, getattr(c, field), kl_kinds()) for field in ("kl_loss_type", "kl_penalty")]
    for field, value, known in named:
        listed = KL_LISTED if field in ("kl_loss_type", "kl_penalty") else None
        if error := choice_error(field, value, known, listed=listed):
            errors.append(error)
    return errors


def _check_sizes(c: GRPOSettings) -> list[str]:
    errors = []
    for field in ("prompts_per_step", "group_size", "max_prompt_length", "max_response_length"):
        if getattr(c, field) < 1:
            errors.append(f"{field}={getattr(c, field)} must be >= 1.")
    if errors:
        return errors
    if c.group_size < 2 and _is_group_estimator(c):
        errors.append(
            f"group_size={c.group_size} with adv_estimator={c.adv_estimator!r}: a group of one "
            "has no relative signal (its advantage is the raw reward or zero). Set "
            "group_size >= 2 (verl examples use 5; DAPO 16) or use a non-group estimator."
        )
    plan = c.batch_plan()
    mb, learners = plan.prompts_per_minibatch, plan.num_learners
    if mb > c.prompts_per_step or c.prompts_per_step % mb:
        errors.append(
            f"prompts_per_minibatch={mb} must divide prompts_per_step={c.prompts_per_step} "
            "(both in prompts); e.g. set prompts_per_minibatch to a divisor of prompts_per_step."
        )
    if c.prompts_per_step % learners or (mb * c.group_size) % learners:
        errors.append(
            f"prompts_per_step={c.prompts_per_step} and the mini-batch of {mb}x{c.group_size} "
            f"trajectories must split evenly over num_learners={learners} so every learner holds "
            "whole groups and takes the same number of steps; make prompts_per_step and "
            "prompts_per_minibatch multiples of num_learners."
        )
    per_learner_mb = plan.trajectories_per_minibatch_per_learner
    micro = c.micro_batch_size_per_learner
    if not c.micro_batches_by_tokens and micro is not None and (
            micro < 1 or per_learner_mb % micro):
        errors.append(
            f"micro_batch_size_per_learner={micro} (trajectories) must divide the per-learner "
            f"mini-batch of {per_learner_mb} trajectories (prompts_per_minibatch {mb} x "
            f"group_size {c.group_size} / {learners} learners)."
        )
    longest = c.max_prompt_length + c.max_response_length
    if c.micro_batches_by_tokens and c.max_tokens_per_micro_batch < longest:
        errors.append(
            f"max_tokens_per_micro_batch={c.max_tokens_per_micro_batch} is below the longest "
            f"sequence (max_prompt_length + max_response_length = {longest}); raise it to at "
            f"least {longest}."
        )
    return errors


def _check_algorithm(c: GRPOSettings) -> list[str]:
    errors = []
    if c.use_kl_in_reward and c.use_kl_loss and not c.allow_kl_in_reward_and_loss:
        errors.append(
            "use_kl_in_reward and use_kl_loss are both on: the KL would be applied twice "
            "(verl issue #265). Turn one off (GRPO uses use_kl_loss), or set "
            "allow_kl_in_reward_and_loss=True if you mean it."
        )
    if c.temperature <= 0:
        errors.append(
            f"temperature={c.temperature}: log-probs are computed at the sampling temperature, "
            "which must be > 0; and greedy decoding gives every response in a group the same "
            "text, so no group has a signal. Use temperature 1.0 (verl's default)."
        )
    if c.clip_ratio_c <= 1.0:
        errors.append(f"clip_ratio_c={c.clip_ratio_c} must be > 1 (dual clip; verl uses 3).")
    if error := choice_error("rollout_is", c.rollout_is, (None, *ROLLOUT_IS_LEVELS)):
        errors.append(error)
    if c.rollout_is and c.rollout_is_threshold <= 0:
        errors.append(f"rollout_is_threshold={c.rollout_is_threshold} must be > 0.")
    if c.kl_ctrl_type == "adaptive" and c.kl_horizon <= 0:
        errors.append(f"kl_horizon={c.kl_horizon} must be > 0 for the adaptive KL controller.")
    return errors


def _check_recipes(c: GRPOSettings) -> list[str]:
    errors = []
    hint = (" (seq_final_reward includes the in-reward KL, which is computed on the learners)"
            if c.filter_groups_metric == "seq_final_reward" else "")
    if c.filter_groups and (error := choice_error("filter_groups_metric", c.filter_groups_metric,
                                                  FILTER_METRICS, note=hint)):
        errors.append(error)
    if c.gen_prompts_per_batch is not None and c.gen_prompts_per_batch < 1:
        errors.append(f"gen_prompts_per_batch={c.gen_prompts_per_batch} must be >= 1 (prompts).")
    if c.overlong_buffer_len < 0 or c.overlong_buffer_len > c.max_response_length:
        errors.append(
            f"overlong_buffer_len={c.overlong_buffer_len} must be between 0 (off) and "
            f"max_response_length={c.max_response_length} tokens.")
    if c.val_every and (c.val_n < 1 or (c.val_num_prompts is not None
                                         and c.val_num_prompts < 1)):
        errors.append(f"val_n={c.val_n} and val_num_prompts={c.val_num_prompts} must be >= 1.")
    return errors


def _check_lora_and_memory(c: GRPOSettings) -> list[str]:
    errors = []
    if c.lora_rank < 0:
        errors.append(f"lora_rank={c.lora_rank} must be >= 0 (0 = full fine-tuning).")
    if c.lora_rank > 0:
        if c.lora_alpha <= 0:
            errors.append(f"lora_alpha={c.lora_alpha} must be > 0 (the adapter's scale is "
                          "lora_alpha / lora_rank).")
        if not 0 <= c.lora_dropout < 1:
            errors.append(f"lora_dropout={c.lora_dropout} must be in [0, 1).")
        if error := choice_error("lora_sync", c.lora_sync, LORA_SYNC_MODES):
            errors.append(error)
        if c.fsdp and c.num_learners >= 2:
            errors.append(f"lora_rank={c.lora_rank} with FSDP sharding over {c.num_learners} "
                          "learners is not supported yet; set fsdp=False (each learner holds "
                          "the frozen base and DDP averages the small adapter's gradients).")
    if error := choice_error("token_stats", c.learner_token_stats, TOKEN_STATS_MODES,
                             note="; or None: 'auto' on GPU learners, 'full' on CPUs"):
        errors.append(error)
    errors += _check_weight_sync(c)
    fraction = c.sampler_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        errors.append(f"sampler_memory_fraction={fraction} must be in (0, 1] (a share of "
                      "the GPU's memory, vLLM's gpu_memory_utilization).")
    if not getattr(c, "gpu_memory_gib", 1) > 0:
        errors.append(f"gpu_memory_gib={c.gpu_memory_gib} must be > 0 (GiB of one GPU, as "
                      "CUDA reports it; explain and dry-run take --gpu-memory).")
    return errors


COMPUTE_DTYPES = ("float32", "bfloat16", "float16")
MASTER_DTYPES = ("float32", "bfloat16")
FSDP_DTYPES = {"fsdp_param_dtype": ("auto", "model", *COMPUTE_DTYPES),
               "fsdp_reduce_dtype": ("model", *COMPUTE_DTYPES)}


def _check_precision(c: GRPOSettings) -> list[str]:
    errors = []
    allowed = {"model_dtype": ("auto", *COMPUTE_DTYPES), "master_weights_dtype": MASTER_DTYPES,
               "reward_model_dtype": ("auto", *COMPUTE_DTYPES), **FSDP_DTYPES}
    for field, known in allowed.items():
        if error := choice_error(field, getattr(c, field), known,
                                 note=" (verl's bf16/fp32 spellings are accepted)"):
            errors.append(error)
    if not errors and c.master_weights_dtype == "bfloat16" and c.compute_dtype == "float32":
        errors.append("master_weights_dtype='bfloat16' with model_dtype='float32': the weights "
                      "would be stored less precisely than they are computed with. Use "
                      "model_dtype='bfloat16' (bf16 compute) with master_weights_dtype='float32'.")
    return errors


def _check_weight_sync(c: GRPOSettings) -> list[str]:
    """An unknown setting, and a setting or placement the weight sync's planner refuses
    for the placement plan's places (as the run's planner would)."""
    transport = getattr(c, "weight_sync_transport", "auto")
    if error := choice_error("weight_sync_transport", transport, WEIGHT_SYNC_TRANSPORTS):
        return [error]
    errors = []
    try:
        plan = c.placement_plan() if hasattr(c, "placement_plan") else None
    except Exception:  # noqa: BLE001 - a layout the placement checks refuse, naming it
        plan = None
    if plan is not None:
        try:
            planned_transports(c, plan)
        except ValueError as error:
            errors.append(str(error))
    return errors


def _check_multi_turn(c: GRPOSettings) -> list[str]:
    errors = []
    for field in ("max_turns", "max_tokens_per_turn", "max_observation_tokens"):
        value = getattr(c, field, None)
        if value is not None and (not isinstance(value, int) or value < 1):
            errors.append(f"{field}={value!r} must be an integer >= 1, or None (no limit).")
    per_turn = getattr(c, "max_tokens_per_turn", None)
    if isinstance(per_turn, int) and per_turn > c.max_response_length:
        errors.append(f"max_tokens_per_turn={per_turn} exceeds max_response_length="
                      f"{c.max_response_length}, the whole episode's response budget (model and "
                      "environment tokens); lower it or raise max_response_length.")
    return errors


def cluster_fit_errors(c: GRPOSettings) -> list[str]:
    """A run larger than the cluster its config declares (``num_nodes`` x ``gpus_per_node``
    GPUs, verl's trainer.nnodes x trainer.n_gpus_per_node): the process that finds no GPU,
    named, before Ray starts (Ray would wait for it forever)."""
    if not (c.num_nodes and c.gpus_per_node and hasattr(c, "placement_plan")):
        return []
    nodes = [{"CPU": float("inf"), "GPU": float(c.gpus_per_node)}] * c.num_nodes
    why = unplaceable(c.placement_plan(), nodes)
    if why is None:
        return []
    return [f"the run does not fit its {c.num_nodes} node(s) x {c.gpus_per_node} GPUs "
            f"(num_nodes x gpus_per_node, verl trainer.nnodes x trainer.n_gpus_per_node): "
            f"{why}; add a node (num_nodes), or give that process no GPU or a share of the "
            "learners' GPUs (num_gpus_per_reward_worker, num_gpus_per_env_runner)."]


def find_errors(c: GRPOSettings) -> list[str]:
    """Settings that cannot run, each naming the field and the fix."""
    return (_check_names(c) + _check_sizes(c) + _check_algorithm(c) + _check_recipes(c)
            + _check_lora_and_memory(c) + _check_precision(c)
            + _check_lr_schedule(c)
            + _check_env_and_sampler(c) + _check_multi_turn(c) + input_errors(c)
            + async_errors(c) + vision_errors(c) + _memory_plan_errors(c))


def _memory_plan_errors(c: GRPOSettings) -> list[str]:
    """The memory plan's phases that overflow a GPU (`memory.memory_errors`), once the
    settings it reads are valid."""
    if _check_sizes(c) or choice_error("token_stats", c.learner_token_stats, TOKEN_STATS_MODES) \
            or _check_precision(c):
        return []
    from rllib_grpo.rllib.config.memory import memory_errors

    return memory_errors(c)


def _precision_pitfalls(c: GRPOSettings) -> list[str]:
    pitfalls = []
    if c.master_weights_dtype == "bfloat16" and c.lora_rank <= 0:
        pitfalls.append(
            "master_weights_dtype='bfloat16': parameters and AdamW states in bf16 (pure-bf16 "
            "training). An AdamW step moves a weight by about lr (1e-6 in verl's recipe), far "
            "below bf16's spacing of 2^-8 of the weight, so most updates round away and "
            "training silently stalls. Keep master_weights_dtype='float32' (fp32 master "
            "weights, bf16 compute: verl, TRL and OpenRLHF do this).")
    if c.compute_dtype == "float16":
        pitfalls.append("model_dtype='float16': fp16 compute without loss scaling can underflow "
                        "small gradients to zero; prefer model_dtype='bfloat16'.")
    return pitfalls


def find_pitfalls(c: GRPOSettings) -> list[str]:
    """Settings that run but are probably not what the user meant, each with its fix."""
    pitfalls = async_pitfalls(c)
    dr_adv = not c.norm_adv_by_std_in_grpo and c.adv_estimator == "grpo"
    dr_agg = c.loss_agg_mode == "seq-mean-token-sum-norm"
    if dr_adv and not dr_agg:
        pitfalls.append(
            "Dr.GRPO half-applied: norm_adv_by_std_in_grpo=False but loss_agg_mode="
            f"{c.loss_agg_mode!r}; Dr.GRPO also needs loss_agg_mode='seq-mean-token-sum-norm' "
            "(and use_kl_loss=False)."
        )
    if dr_agg and c.adv_estimator == "grpo" and c.norm_adv_by_std_in_grpo:
        pitfalls.append(
            "Dr.GRPO half-applied: loss_agg_mode='seq-mean-token-sum-norm' but "
            "norm_adv_by_std_in_grpo=True; Dr.GRPO also sets norm_adv_by_std_in_grpo=False."
        )
    if 0 < c.temperature < 0.3 and _is_group_estimator(c):
        pitfalls.append(
            f"temperature={c.temperature} is low for a group estimator: responses in a group "
            "will mostly be identical, so most groups carry no signal. Use ~1.0."
        )
    forced = forced_agg_mode(c.policy_loss) if c.policy_loss in POLICY_LOSSES else None
    if forced and c.loss_agg_mode != forced:
        pitfalls.append(
            f"policy_loss={c.policy_loss!r} always aggregates with "
            f"{forced!r}; loss_agg_mode={c.loss_agg_mode!r} only affects the "
            "KL and entropy terms."
        )
    if c.filter_groups and c.group_size < 2:
        pitfalls.append("filter_groups with group_size 1 keeps every group (a single sample is "
                        "never filtered): dynamic sampling does nothing.")
    if c.adv_estimator == "remax" and c.group_size > 1:
        pitfalls.append("remax uses a greedy baseline per prompt, not the group: group_size "
                        f"{c.group_size} only adds samples (one extra greedy generation per prompt).")
    pitfalls += (_lora_and_memory_pitfalls(c) + _precision_pitfalls(c)
                 + local_env_runner_pitfalls(c))
    if c.top_p < 1.0 or c.top_k > 0:
        pitfalls.append(
            f"top_p={c.top_p}, top_k={c.top_k}: the trainer's log-probs ignore the sampling "
            "filter, so rollout and trainer probabilities differ; watch "
            "training/rollout_probs_diff_mean or keep top_p=1, top_k=-1."
        )
    return pitfalls


def _lora_and_memory_pitfalls(c: GRPOSettings) -> list[str]:
    pitfalls = []
    lr = getattr(c, "lr", None)
    lr = lr if isinstance(lr, int | float) else None
    if c.lora_rank > 0 and lr is not None and lr < 1e-5:
        pitfalls.append(f"lr={lr} with LoRA: an adapter usually needs a learning rate about an "
                        "order of magnitude above full fine-tuning (verl's LoRA guide); try "
                        f"{lr * 10:g}.")
    if c.ref_param_offload and (c.lora_rank > 0 or not (c.use_kl_loss or c.use_kl_in_reward)):
        why = ("the reference is the policy with its adapter disabled" if c.lora_rank > 0
               else "no KL term is on, so no reference model is loaded")
        pitfalls.append(f"ref_param_offload=True does nothing: {why}.")
    if c.micro_batches_by_tokens and not c.use_remove_padding:
        pitfalls.append(
            f"use_dynamic_bsz with use_remove_padding=False: max_tokens_per_micro_batch="
            f"{c.max_tokens_per_micro_batch} counts real tokens, but padded rows compute rows x "
            "the longest sequence, so a micro-batch can hold several times the budget in memory "
            "(verl's budget assumes padding removal); set use_remove_padding=True.")
    return pitfalls


def _check_lr_schedule(c: GRPOSettings) -> list[str]:
    errors = []
    if error := choice_error("lr_scheduler_type", c.lr_scheduler_type, LR_SCHEDULER_TYPES):
        return [error]
    scheduled = c.lr_warmup_steps != 0 or c.lr_scheduler_type != "constant"
    if isinstance(getattr(c, "lr", None), list | tuple) and scheduled:
        errors.append("lr is an RLlib schedule ([[timestep, lr], ...]) and lr_warmup_steps / "
                      "lr_scheduler_type ask for verl's schedule too: use one of them.")
    if needs_total_steps(c.lr_scheduler_type, c.lr_warmup_steps, c.lr_warmup_steps_ratio) and (
            c.total_training_steps is None):
        errors.append(f"lr_scheduler_type={c.lr_scheduler_type!r} / lr_warmup_steps_ratio="
                      f"{c.lr_warmup_steps_ratio} need the run's length: set "
                      "total_training_steps (the command line takes it from "
                      "trainer.total_training_steps or the stop training_iteration).")
    for field in ("lr_warmup_steps_ratio", "min_lr_ratio"):
        value = getattr(c, field)
        if value is not None and not 0 <= value <= 1:
            errors.append(f"{field}={value} must be in [0, 1] (a fraction of lr's steps/value).")
    if c.total_training_steps is not None and c.total_training_steps < 1:
        errors.append(f"total_training_steps={c.total_training_steps} must be >= 1 (or None).")
    return errors


# Engine options only vLLM takes (the transformers sampler refuses them by name).
HF_SAMPLER_OPTIONS = ("device", "max_batch_size", "config_overrides", "dtype")


def _check_env_and_sampler(c: GRPOSettings) -> list[str]:
    errors = []
    cls = env_class(c.env)
    names, open_ended = env_options(cls) if cls is not None else (set(), True)
    for field in ("env_config", "val_env_config"):
        unknown = sorted(set(getattr(c, field) or {}) - names)
        if not open_ended and unknown:
            hint = (" For prompt files (verl's data.train_files/val_files) use a file env: "
                    "env='rllib_grpo/Prompts-v0' (each row's data_source picks the reward), "
                    "'rllib_grpo/GSM8K-v0' or 'rllib_grpo/MATH-v0'."
                    if {"path", "prompt_key"} & set(unknown) else "")
            errors.append(f"{field} has {', '.join(map(repr, unknown))} but env {c.env!r} takes "
                          f"no such option (it takes: {', '.join(sorted(names))}).{hint}")
    tp = tensor_parallel_size(c)
    if tp > 1 and c.sampler == "hf":
        errors.append(f"tensor_parallel_size={tp} (verl rollout.tensor_model_parallel_size) "
                      "needs the vLLM sampler; set sampler='vllm' or tensor_parallel_size=1.")
    errors += layout_errors(c) + cluster_fit_errors(c)
    vllm_only = sorted(set(c.sampler_config or {}) - set(HF_SAMPLER_OPTIONS))
    if c.sampler == "hf" and vllm_only:
        errors.append(f"sampler_config has vLLM engine options {', '.join(vllm_only)} but "
                      "sampler='hf' takes only " + ", ".join(HF_SAMPLER_OPTIONS) + "; drop them "
                      "or use sampler='vllm'.")
    if c.overlong_buffer_enable and c.overlong_buffer_len <= 0:
        errors.append("overlong_buffer_enable=True needs overlong_buffer_len > 0 tokens "
                      "(verl reward_model.overlong_buffer.len).")
    return errors


# ----------------------------------------------------------------------------
# Numeric ranges, the model and the data files
# ----------------------------------------------------------------------------

# (field, predicate, requirement) for scalar settings; None values are skipped ("off").
_POSITIVE = (lambda v: v > 0, "a finite number > 0")
_NON_NEGATIVE = (lambda v: v >= 0, "a finite number >= 0")
# Fields whose range the consistency checks above explain; here only NaN / infinity is refused.
_FINITE = (lambda v: True, "a finite number")
_RANGES: list[tuple[str, Callable[[float], bool], str]] = [
    ("grad_clip", *_POSITIVE),
    ("clip_ratio", *_POSITIVE),
    ("clip_ratio_low", *_POSITIVE),
    ("clip_ratio_high", *_POSITIVE),
    ("clip_ratio_c", *_FINITE),
    ("temperature", *_FINITE),
    ("kl_loss_coef", *_NON_NEGATIVE),
    ("kl_coef", *_NON_NEGATIVE),
    ("kl_target", *_POSITIVE),
    ("entropy_coeff", *_NON_NEGATIVE),
    ("weight_decay", *_NON_NEGATIVE),
    ("overlong_penalty_factor", *_NON_NEGATIVE),
    ("loss_scale_factor", *_POSITIVE),
    ("rollout_is_threshold", *_FINITE),
    ("val_temperature", *_NON_NEGATIVE),
    ("top_p", lambda v: 0 < v <= 1, "a probability in (0, 1]"),
    ("lr_warmup_steps", lambda v: v == -1 or v >= 0,
     "a number of optimizer steps >= 0, or -1 (verl: use lr_warmup_steps_ratio)"),
    ("keep_checkpoints", *_NON_NEGATIVE),
    ("max_skipped_steps", *_NON_NEGATIVE),
    ("env_runner_restart_timeout_s", *_POSITIVE),
    ("weight_sync_connect_timeout_s", *_POSITIVE),
]


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _lr_error(lr: object) -> str | None:
    """``lr`` is a number > 0 or an RLlib schedule ``[[timestep, value], ...]`` of values
    >= 0 (a warm-up may start at 0), all finite."""
    if _is_number(lr):
        return None if math.isfinite(lr) and lr > 0 else (
            f"lr={lr!r} must be a finite number > 0 (verl's GRPO uses 1e-6).")
    if isinstance(lr, list | tuple) and lr and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(map(_is_number, p)) for p in lr):
        values = [p[1] for p in lr]
        if all(math.isfinite(v) and v >= 0 for v in values) and any(v > 0 for v in values):
            return None
        return f"lr schedule {lr!r}: every value must be finite and >= 0, and one > 0."
    return f"lr={lr!r} must be a number > 0 or a schedule [[timestep, lr], ...]."


def range_errors(c: GRPOSettings) -> list[str]:
    """Numbers out of their range (or NaN / infinite), each naming the field."""
    errors = [e for e in [_lr_error(getattr(c, "lr", 1.0))] if e]
    for field, ok, requirement in _RANGES:
        value = getattr(c, field, None)
        if value is None:
            continue
        if not _is_number(value) or not math.isfinite(value) or not ok(value):
            errors.append(f"{field}={value!r} must be {requirement}.")
    betas = getattr(c, "betas", (0.9, 0.999))
    if not (isinstance(betas, list | tuple) and len(betas) == 2 and all(
            _is_number(b) and 0 <= b < 1 for b in betas)):
        errors.append(f"betas={betas!r} must be two numbers in [0, 1) (AdamW's beta1, beta2).")
    return errors


def _data_paths(c: GRPOSettings) -> list[tuple[str, Any]]:
    """``(field, path)`` of every data file; a list of files (verl's ``data.train_files``
    may be one) gives one entry per file, named by its position.  A `TextEnv`'s own
    ``dataset`` option counts when it names a file (`_dataset_file`)."""
    paths = []
    for field in ("env_config", "val_env_config"):
        settings = getattr(c, field, None) or {}
        if not isinstance(settings, dict):
            continue
        if settings.get("path") is not None:
            given = settings["path"]
            if isinstance(given, list | tuple):
                paths += [(f"{field}.path[{i}]", path) for i, path in enumerate(given)]
                paths += [] if given else [(f"{field}.path", None)]  # no file: no data
            else:
                paths.append((f"{field}.path", given))
        if (dataset := _dataset_file(c, settings)) is not None:
            paths.append((f"{field}.dataset", dataset))
    return paths


def _dataset_file(c: GRPOSettings, settings: dict) -> str | Path | None:
    """The file a `TextEnv` (or subclass) loads its ``dataset`` option from, or None for
    rows given in memory (a list, a `PromptDataset`) and envs of other kinds (their
    ``dataset`` may mean something else)."""
    dataset = settings.get("dataset")
    if not isinstance(dataset, str | Path):
        return None
    cls = env_class(getattr(c, "env", None))
    return dataset if cls is not None and issubclass(cls, TextEnv) else None


def _reward_file_errors(c: GRPOSettings) -> list[str]:
    errors = []
    for field in ("env_config", "val_env_config"):
        spec = (getattr(c, field, None) or {}).get("reward_fn")
        if isinstance(spec, str) and ".py:" in spec:
            file = Path(spec.rpartition(":")[0]).expanduser()
            if not file.is_file():
                errors.append(f"{field}.reward_fn={spec!r}: no such file {file}.")
    return errors


def resource_errors(c: GRPOSettings) -> list[str]:
    """The model and the data files must exist and be readable (nothing is loaded)."""
    errors = []
    model_error = model_path_error(c.model_path,
                                   allow_hub_download=getattr(c, "allow_hub_download", False))
    if model_error:
        errors.append(model_error)
    for field, path in _data_paths(c):
        if path is None:
            errors.append(f"{field} is an empty list of files: an empty dataset.")
        elif not isinstance(path, str | Path):
            errors.append(f"{field}={path!r} must be a file path.")
        elif problem := prompt_file_error(Path(path).expanduser()):
            errors.append(f"{field}: {problem}.")
    return errors + _reward_file_errors(c)


def input_errors(c: GRPOSettings) -> list[str]:
    """`range_errors`, `resource_errors` and the door's checks (`reward_fn_errors` and the rest below): counts,
    the env id, one call of the reward function and, when the env and its files are
    there, every prompt's length (`prompt_lengths`)."""
    env_error = env_id_error(getattr(c, "env", None))
    resources = resource_errors(c)
    lengths = [] if env_error or resources else prompt_length_errors(c)
    return (range_errors(c) + count_errors(c) + ([env_error] if env_error else [])
            + resources + lengths + reward_fn_errors(c) + reward_plan_errors(c)
            + logger_errors(c))


# ----------------------------------------------------------------------------
# The door: counts, the env id, the reward function, the loggers
# ----------------------------------------------------------------------------

# Process and device counts (RLlib's own fields): a negative one is accepted by RLlib.
COUNT_FIELDS = ("num_env_runners", "num_envs_per_env_runner", "num_learners",
                "num_gpus_per_learner", "num_cpus_per_learner", "num_gpus_per_env_runner",
                "num_cpus_per_env_runner", "evaluation_num_env_runners", "num_epochs")


def count_errors(c: GRPOSettings) -> list[str]:
    """Every count is >= 0 (``"auto"`` and other non-numbers are RLlib's to judge)."""
    errors = []
    for field in COUNT_FIELDS:
        value = getattr(c, field, None)
        if isinstance(value, int | float) and not isinstance(value, bool) and value < 0:
            errors.append(f"{field}={value!r} must be >= 0.")
    return errors


def env_id_error(env: object) -> str | None:
    """An env given by name must be a gymnasium id, a Tune-registered name or an
    importable ``module.Class``; the nearest gymnasium ids are suggested."""
    if not isinstance(env, str):
        return None
    import gymnasium

    if env in gymnasium.registry or _tune_registered(env) or _importable(env):
        return None
    return f"env={env!r} is no registered gymnasium id nor env class." + did_you_mean(
        env, gymnasium.registry)


def _tune_registered(name: str) -> bool:
    from ray.tune.registry import ENV_CREATOR, _global_registry

    return bool(_global_registry.contains(ENV_CREATOR, name))


def _importable(path: str) -> bool:
    module, _, name = path.replace(":", ".").rpartition(".")
    try:
        return module != "" and isinstance(getattr(importlib.import_module(module), name, None),
                                           type)
    except Exception:  # noqa: BLE001  (not a module path: not an env class)
        return False


def _user_reward_fns(c: GRPOSettings) -> list[tuple[str, str, dict]]:
    """``(field, spec, env settings)`` of each reward function given as ``"module:function"``
    or ``"file.py:function"`` in ``env_config`` / ``val_env_config`` whose file exists
    (`_reward_file_errors` names a missing one); registered names, None and callables are not
    user code the door imports."""
    found = []
    for field in ("env_config", "val_env_config"):
        settings = getattr(c, field, None) or {}
        spec = settings.get("reward_fn")
        if not isinstance(spec, str) or ":" not in spec:
            continue
        file = spec.rpartition(":")[0]
        if file.endswith(".py") and not Path(file).expanduser().is_file():
            continue
        found.append((field, spec, settings))
    return found


def reward_fn_errors(c: GRPOSettings) -> list[str]:
    """Each user reward function (`_user_reward_fns`) imports and, called once on a
    sample built from the first row of the data, returns a number or a dict with
    ``"score"``, without killing its process and in time (`_probe_timeout_s`).  The call runs
    in a child process (`rllib_grpo.rewards.probe`): none of the user's code runs here.
    A call that raises is left to run time (that sample scores 0)."""
    from rllib_grpo.rewards.probe import probe_reward_fn

    errors = []
    for field, spec, settings in _user_reward_fns(c):
        problem = probe_reward_fn(spec, _first_row_sample(settings),
                                  dict(settings.get("reward_kwargs") or {}),
                                  timeout_s=_probe_timeout_s(settings))
        if problem:
            errors.append(f"{field}.reward_fn={spec!r}: {problem}.")
    return errors


def _probe_timeout_s(settings: dict) -> float:
    """The door's limit on the child (start, import and one call): `PROBE_TIMEOUT_S`, plus
    the run's own limit on one call (``reward_timeout_s``) where that is longer."""
    from rllib_grpo.rewards.probe import PROBE_TIMEOUT_S

    per_call = settings.get("reward_timeout_s")
    if isinstance(per_call, int | float) and not isinstance(per_call, bool) and \
            per_call > PROBE_TIMEOUT_S:
        return PROBE_TIMEOUT_S + float(per_call)
    return PROBE_TIMEOUT_S


def reward_fn_probe_lines(c: GRPOSettings) -> list[str]:
    """``explain``'s line per user reward function: the door calls it once, and where."""
    return [f"reward check:                  {field}.reward_fn {spec!r} is imported and called "
            "once on the first row (its ground truth as the response), in a child process, "
            f"{_probe_timeout_s(settings):g} s at most" for field, spec, settings in
            _user_reward_fns(c)]


def _first_row_sample(settings: dict) -> tuple[str, str, Any, dict | None]:
    """``(data_source, solution_str, ground_truth, extra_info)`` from the first row of the
    data file (the ground truth as the response), or an empty sample without a file."""
    path = settings.get("path")
    path = path[0] if isinstance(path, list | tuple) and path else path
    if not isinstance(path, str):
        return "", "", "", None
    from rllib_grpo.envs.datasets import load_prompts

    try:
        first = load_prompts(path, prompt_key=settings.get("prompt_key", "prompt"))[0]
    except Exception:  # noqa: BLE001  (the data's own checks report it)
        return "", "", "", None
    return first.data_source, str(first.ground_truth), first.ground_truth, first.extra_info


def logger_errors(c: GRPOSettings) -> list[str]:
    """Every name in ``loggers`` is known, its package is installed, and MLflow's tracking
    store is usable (`mlflow_store_error`)."""
    loggers = getattr(c, "loggers", ())
    names = [loggers] if isinstance(loggers, str) else list(loggers or ())
    errors = []
    for name in names:
        if error := choice_error("loggers", name, LOGGER_PACKAGES, note=" (any of them)"):
            errors.append(error)
        elif (package := LOGGER_PACKAGES[name]) and importlib.util.find_spec(package) is None:
            errors.append(f"loggers: {name!r} needs the {package} package: pip install {package}.")
        elif name == "mlflow" and (error := mlflow_store_error(mlflow_tracking_uri())):
            errors.append(error)
    return errors


# MLflow's database stores (SQLAlchemy URIs, ``dialect+driver://``): they need sqlalchemy
# and alembic, which mlflow-skinny does not install.
MLFLOW_DB_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql")
MLFLOW_DB_PACKAGES = ("sqlalchemy", "alembic")
ALLOW_FILE_STORE = "MLFLOW_ALLOW_FILE_STORE"


def mlflow_tracking_uri() -> str:
    """The store Tune's `MLflowLoggerCallback` logs to (it passes no URI of its own):
    ``MLFLOW_TRACKING_URI``, else MLflow's default (``sqlite:///mlflow.db`` in the working
    folder since MLflow 3; ``./mlruns`` where that already holds runs)."""
    import mlflow

    return str(mlflow.get_tracking_uri())


def is_file_store(uri: str) -> bool:
    """``file:`` URIs and plain paths (MLflow's file store)."""
    from urllib.parse import urlparse

    return urlparse(uri).scheme in ("", "file")


def mlflow_store_error(uri: str) -> str | None:
    """The one-line refusal of a tracking store MLflow would refuse after Ray started:

    * a file store when ``MLFLOW_ALLOW_FILE_STORE`` is set false (MLflow 3 refuses file
      stores unless it is true; left unset, `allow_file_store` sets it for the store named);
    * a database store (MLflow's default ``sqlite:///mlflow.db`` included) without
      sqlalchemy and alembic (mlflow-skinny has neither);

    None for a usable one (HTTP servers, Databricks and other schemes are MLflow's to judge)."""
    from urllib.parse import urlparse

    if is_file_store(uri):
        value = os.environ.get(ALLOW_FILE_STORE)
        if value is not None and value.strip().lower() not in ("true", "1"):
            return (f"loggers: 'mlflow' logs to the file store {uri}, which MLflow refuses with "
                    f"{ALLOW_FILE_STORE}={value}; unset it or set {ALLOW_FILE_STORE}=true.")
        return None
    dialect = urlparse(uri).scheme.split("+")[0]
    missing = [p for p in MLFLOW_DB_PACKAGES if importlib.util.find_spec(p) is None]
    if dialect in MLFLOW_DB_SCHEMES and missing:
        return (f"loggers: 'mlflow' logs to {uri} (MLFLOW_TRACKING_URI, else MLflow's default "
                f"store), which needs {' and '.join(missing)} (mlflow-skinny lacks them): "
                f"pip install {' '.join(missing)}, or set MLFLOW_TRACKING_URI=file:./mlruns "
                "(a file store) or http://<host>:<port> (a tracking server).")
    return None


def allow_file_store(uri: str) -> None:
    """Let MLflow 3 use the file store ``uri`` names (it refuses file stores unless
    ``MLFLOW_ALLOW_FILE_STORE`` is true); an explicit setting of the variable is kept."""
    if is_file_store(uri):
        os.environ.setdefault(ALLOW_FILE_STORE, "true")
