"""The classic mistakes in a GRPO configuration.

`find_errors` lists settings that cannot run (used by `GRPOConfig.validate`);
`find_pitfalls` lists settings that run but probably not as intended (printed by
`explain`).  The checks read the config's attributes only, so they work on any
object carrying the GRPO fields.
"""

from __future__ import annotations

from rllib_grpo.algos import ADV_ESTIMATORS, AGG_MODES, KL_CONTROLLERS, POLICY_LOSSES, kl_kinds
from rllib_grpo.algos.advantages import needs_groups
from rllib_grpo.algos.lr_schedule import LR_SCHEDULER_TYPES, needs_total_steps
from rllib_grpo.algos.policy_losses import forced_agg_mode
from rllib_grpo.algos.rollout_is import ROLLOUT_IS_LEVELS
from rllib_grpo.data.recipes import FILTER_METRICS
from rllib_grpo.envs.datasets import TRUNCATION_MODES
from rllib_grpo.envs.text import env_options
from rllib_grpo.models.lm_head import TOKEN_STATS_MODES
from rllib_grpo.models.lora import LORA_SYNC_MODES
from rllib_grpo.rllib.config.gpu_layout import (
    layout_errors,
    local_env_runner_pitfalls,
    planned_transports,
    tensor_parallel_size,
    unplaceable,
)
from rllib_grpo.rllib.config.input_checks import input_errors
from rllib_grpo.rllib.config.settings import GRPOSettings, choice_error
from rllib_grpo.rllib.config.staleness import async_errors, async_pitfalls
from rllib_grpo.rllib.config.text_env import env_class
from rllib_grpo.rllib.config.vision_plan import vision_errors
from rllib_grpo.samplers import SAMPLER_KINDS
from rllib_grpo.weights.plan import WEIGHT_SYNC_TRANSPORTS


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
    if c.peak_tflops is not None and not c.peak_tflops > 0:
        errors.append(f"peak_tflops={c.peak_tflops} must be > 0 (TFLOP/s of one learner "
                      "device, for perf/mfu/actor) or None (known GPUs by name).")
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
    """An unknown setting, a bucket size <= 0, and a setting or placement the weight sync's
    planner refuses for the placement plan's places (as the run's planner would)."""
    transport = getattr(c, "weight_sync_transport", "auto")
    if error := choice_error("weight_sync_transport", transport, WEIGHT_SYNC_TRANSPORTS):
        return [error]
    errors = []
    if not getattr(c, "weight_sync_bucket_mb", 1) > 0:
        errors.append(f"weight_sync_bucket_mb={c.weight_sync_bucket_mb} must be > 0 (MiB per "
                      "packed buffer; 256-1024 suits most models).")
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
