"""Every GRPO knob in one table: type, default, unit, meaning and verl name.

`GRPOConfig` takes its GRPO-specific attributes from `GRPOSettings`; the
`verl` metadata maps verl's dotted config names onto them (one mechanism for
`explain`, the verl aliases of the command line and the docs).  No Ray here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


def knob(default: Any, unit: str, doc: str, verl: str | tuple[str, ...] = ()) -> Any:
    """A settings field: default, unit (prompts / trajectories / tokens / ...), doc, verl names."""
    verl_names = (verl,) if isinstance(verl, str) else tuple(verl)
    factory = (lambda d=default: dict(d)) if isinstance(default, dict) else None
    if factory is not None:
        return field(default_factory=factory, metadata={"unit": unit, "doc": doc, "verl": verl_names})
    return field(default=default, metadata={"unit": unit, "doc": doc, "verl": verl_names})


_ACTOR = "actor_rollout_ref.actor."
_ROLLOUT = "actor_rollout_ref.rollout."
_OVERLONG_CFG = "reward_model.reward_kwargs.overlong_buffer_cfg."  # verl main_ppo's spelling


@dataclass(eq=False, repr=False)  # GRPOConfig inherits these fields, not dataclass equality
class GRPOSettings:
    """GRPO settings with their units; `GRPOConfig` inherits them as typed attributes."""

    # --- batch plan -----------------------------------------------------------------
    prompts_per_step: int = knob(
        16, "prompts", "Prompts sampled per training step.", "data.train_batch_size")
    group_size: int = knob(
        8, "trajectories per prompt",
        "Responses sampled per prompt; a group is the episodes reset to one prompt.",
        _ROLLOUT + "n")
    prompts_per_minibatch: int | None = knob(
        None, "prompts",
        "Prompts per optimizer step (global, all learners); None = prompts_per_step "
        "(one optimizer step per training step).", _ACTOR + "ppo_mini_batch_size")
    micro_batch_size_per_learner: int | None = knob(
        None, "trajectories",
        "Trajectories per forward/backward on one learner (gradient accumulation); "
        "None = the whole per-learner mini-batch.", _ACTOR + "ppo_micro_batch_size_per_gpu")
    use_dynamic_bsz: bool = knob(
        False, "flag", "Build micro-batches to a token budget instead of a fixed size.",
        _ACTOR + "use_dynamic_bsz")
    max_tokens_per_micro_batch: int = knob(
        16384, "tokens", "Token budget of one micro-batch when use_dynamic_bsz is on; must "
        "be >= max_prompt_length + max_response_length.", _ACTOR + "ppo_max_token_len_per_gpu")
    use_remove_padding: bool = knob(
        True, "flag", "Run every learner forward (old log-prob, reference, update) on packed "
        "rows: the sequences' real tokens concatenated, positions restarting per sequence, "
        "attention confined to each sequence (rllib_grpo.models.packing); False = padded rows "
        "with attention masks. The log-probs and the update are the same either way.",
        "actor_rollout_ref.model.use_remove_padding")
    skip_old_log_prob_pass: bool = knob(
        True, "flag", "When every sample feeds exactly one optimizer step from the weights "
        "that would recompute its old log-probs (num_epochs 1, one mini-batch per step) and "
        "no advantage reads them (no use_kl_in_reward), take them from the update's own "
        "forward, detached, instead of a separate pass (same loss, gradients, rollout_is "
        "weights and metrics; also with max_staleness >= 1); False always runs the pass.")
    max_prompt_length: int = knob(
        512, "tokens", "Longest prompt; longer ones follow `truncation`.", "data.max_prompt_length")
    max_response_length: int = knob(
        512, "tokens", "Most tokens generated per response.", "data.max_response_length")
    truncation: str = knob(
        "error", "mode", "Overlong prompts: error | left | right | middle.", "data.truncation")
    filter_overlong_prompts: bool = knob(
        False, "flag", "Drop prompts longer than max_prompt_length (counted).",
        "data.filter_overlong_prompts")

    # --- model ----------------------------------------------------------------------
    model_path: str = knob(
        "builtin:demo", "path or id",
        "Causal LM: a local folder, a Hugging Face id, 'smollm2-135m', 'builtin:tiny' "
        "(random) or 'builtin:demo' (the demo's warmed-up char-level model).",
        "actor_rollout_ref.model.path")
    allow_hub_download: bool = knob(
        False, "flag", "Accept a model_path that is neither a local folder nor a built-in "
        "model nor in the local Hugging Face cache, as a hub id every worker downloads; off, "
        "such a path is refused before anything starts.")
    model_dtype: str = knob(
        "float32", "dtype", "Compute and sampling dtype: float32 | bfloat16 (| float16). With "
        "bfloat16 the learner keeps fp32 master weights and AdamW states "
        "(master_weights_dtype) and runs forward/backward in bf16 (autocast on one learner, "
        "FSDP2 MixedPrecisionPolicy with fp32 gradient reduction when sharded); the reference "
        "model and the samplers hold bf16 weights.",
        _ACTOR + "fsdp_config.mixed_precision.param_dtype")
    master_weights_dtype: str = knob(
        "float32", "dtype", "dtype of the trained parameters, their gradients and AdamW "
        "states (the master weights): float32 | bfloat16. 'bfloat16' is pure-bf16 training: "
        "at lr ~1e-6 most updates round away (explain flags it).",
        _ACTOR + "fsdp_config.model_dtype")
    gradient_checkpointing: bool = knob(
        False, "flag", "Recompute activations in backward to save memory.",
        "actor_rollout_ref.model.enable_gradient_checkpointing")
    model_override_config: dict = knob(
        {}, "dict", "Entries overriding the model's HF config (e.g. max_position_embeddings) "
        "in the learner, the reference and the samplers (vLLM hf_overrides); verl's "
        "actor_rollout_ref.model.override_config.*.")

    # --- sampling -------------------------------------------------------------------
    sampler: str = knob(
        "auto", "name", "Sampler: auto (vLLM where it imports, else transformers) | vllm | hf.",
        _ROLLOUT + "name")
    sampler_config: dict = knob(
        {}, "dict", "Engine options for the sampler (dtype, gpu_memory_utilization, "
        "max_model_len, enforce_eager, tensor_parallel_size, kv_cache_space_gb).")
    temperature: float = knob(
        1.0, "scalar", "Sampling temperature; log-probs are computed at the same temperature.",
        _ROLLOUT + "temperature")
    top_p: float = knob(1.0, "probability", "Nucleus sampling mass.", _ROLLOUT + "top_p")
    top_k: int = knob(-1, "tokens", "Top-k sampling; -1 = off.", _ROLLOUT + "top_k")

    # --- advantage and reward ---------------------------------------------------------
    adv_estimator: str = knob(
        "grpo", "name", "Advantage estimator (grpo, rloo, grpo_passk, opo, gpg, "
        "reinforce_plus_plus, reinforce_plus_plus_baseline, remax).", "algorithm.adv_estimator")
    norm_adv_by_std_in_grpo: bool = knob(
        True, "flag", "Divide by the group std; False is Dr.GRPO.",
        "algorithm.norm_adv_by_std_in_grpo")
    use_kl_in_reward: bool = knob(
        False, "flag", "Subtract beta*KL(old||ref) per token from the reward.",
        "algorithm.use_kl_in_reward")
    kl_penalty: str = knob(
        "kl", "name", "KL estimator for the in-reward penalty.", "algorithm.kl_penalty")
    kl_ctrl_type: str = knob(
        "fixed", "name", "In-reward KL controller: fixed | adaptive.", "algorithm.kl_ctrl.type")
    kl_coef: float = knob(
        0.001, "scalar", "In-reward KL coefficient (initial, if adaptive).",
        "algorithm.kl_ctrl.kl_coef")
    kl_target: float = knob(
        0.1, "nats", "Target KL of the adaptive controller.", "algorithm.kl_ctrl.target_kl")
    kl_horizon: int = knob(
        10000, "trajectories", "Horizon of the adaptive controller.", "algorithm.kl_ctrl.horizon")

    # --- actor loss -----------------------------------------------------------------
    use_kl_loss: bool = knob(
        True, "flag", "Add kl_loss_coef * KL(pi||ref) to the loss (verl's GRPO recipe).",
        _ACTOR + "use_kl_loss")
    kl_loss_coef: float = knob(0.001, "scalar", "KL loss coefficient.", _ACTOR + "kl_loss_coef")
    kl_loss_type: str = knob(
        "low_var_kl", "name", "KL estimator of the KL loss (k1, k2, k3, low_var_kl, abs, mse, "
        "and '+' straight-through variants).", _ACTOR + "kl_loss_type")
    allow_kl_in_reward_and_loss: bool = knob(
        False, "flag", "Allow both KL placements at once (applies the KL twice).")
    policy_loss: str = knob(
        "vanilla", "name", "Policy loss (vanilla, gspo, cispo, gpg, sapo).",
        _ACTOR + "policy_loss.loss_mode")
    loss_agg_mode: str = knob(
        "token-mean", "name", "Loss aggregation over tokens (token-mean, token-sum, "
        "seq-mean-token-sum, seq-mean-token-mean, seq-mean-token-sum-norm).",
        _ACTOR + "loss_agg_mode")
    loss_scale_factor: float | None = knob(
        None, "tokens", "Horizon of seq-mean-token-sum-norm; None = max_response_length.",
        _ACTOR + "loss_scale_factor")
    clip_ratio: float = knob(0.2, "ratio", "PPO clip range.", _ACTOR + "clip_ratio")
    clip_ratio_low: float | None = knob(
        None, "ratio", "Lower clip range; None = clip_ratio.", _ACTOR + "clip_ratio_low")
    clip_ratio_high: float | None = knob(
        None, "ratio", "Upper clip range; None = clip_ratio (DAPO clip-higher: 0.28).",
        _ACTOR + "clip_ratio_high")
    clip_ratio_c: float = knob(
        3.0, "ratio", "Dual-clip bound for negative advantages (> 1).", _ACTOR + "clip_ratio_c")
    entropy_coeff: float = knob(0.0, "scalar", "Entropy bonus coefficient.", _ACTOR + "entropy_coeff")

    # --- recipes (DAPO, ReMax) ----------------------------------------------------------
    filter_groups: bool = knob(
        False, "flag", "DAPO dynamic sampling: drop groups whose filter_groups_metric has zero "
        "variance and sample more until prompts_per_step groups remain.",
        "algorithm.filter_groups.enable")
    filter_groups_metric: str = knob(
        "acc", "name", "Per-sample value whose group variance decides: acc | score | seq_reward.",
        "algorithm.filter_groups.metric")
    max_num_gen_batches: int = knob(
        10, "generation batches", "Most generation batches per step with filter_groups "
        "(<= 0: unlimited).", "algorithm.filter_groups.max_num_gen_batches")
    gen_prompts_per_batch: int | None = knob(
        None, "prompts", "Prompts per generation batch with filter_groups; None = "
        "prompts_per_step (DAPO uses 3x).", "data.gen_batch_size")
    overlong_buffer_len: int = knob(
        0, "tokens", "DAPO overlong shaping: penalty ramps from 0 at max_response_length - len "
        "tokens to -overlong_penalty_factor at max_response_length (0 = off).",
        ("reward_model.overlong_buffer.len", _OVERLONG_CFG + "len"))
    overlong_penalty_factor: float = knob(
        1.0, "scalar", "Largest overlong penalty.",
        ("reward_model.overlong_buffer.penalty_factor", _OVERLONG_CFG + "penalty_factor"))
    overlong_buffer_enable: bool | None = knob(
        None, "flag", "Overlong shaping on/off (verl's overlong_buffer.enable); None = on when "
        "overlong_buffer_len > 0.", ("reward_model.overlong_buffer.enable",
                                     _OVERLONG_CFG + "enable"))
    mask_truncated_completions: bool = knob(
        False, "flag", "Exclude responses cut at max_response_length from the loss (counted).")

    # --- validation -------------------------------------------------------------------
    val_every: int = knob(
        0, "training steps", "Evaluate on held-out prompts every N steps and at the last step "
        "(total_training_steps); <= 0 = never (verl's test_freq=-1).", "trainer.test_freq")
    val_before_train: bool = knob(
        False, "flag", "Evaluate once before the first training step (verl's default: on).",
        "trainer.val_before_train")
    val_env_config: dict = knob(
        {}, "dict", "env_config overrides of the held-out env (e.g. another data_seed or path).")
    val_num_prompts: int = knob(32, "prompts", "Held-out prompts per validation.")
    val_n: int = knob(
        1, "trajectories per prompt", "Samples per validation prompt (mean@N, best@N, maj@N).",
        "actor_rollout_ref.rollout.val_kwargs.n")
    val_temperature: float = knob(
        0.0, "scalar", "Validation temperature (0 = greedy).",
        "actor_rollout_ref.rollout.val_kwargs.temperature")
    val_top_p: float = knob(1.0, "probability", "Validation nucleus mass (when sampling).",
                            "actor_rollout_ref.rollout.val_kwargs.top_p")
    val_top_k: int = knob(-1, "tokens", "Validation top-k (when sampling); -1 = off.",
                          "actor_rollout_ref.rollout.val_kwargs.top_k")
    val_do_sample: bool | None = knob(
        None, "flag", "Sample validation responses with val_temperature/top_p/top_k; False = "
        "greedy whatever they say (verl's default); None = sample when val_temperature > 0.",
        "actor_rollout_ref.rollout.val_kwargs.do_sample")

    # --- data order -------------------------------------------------------------------
    data_shuffle: bool = knob(
        True, "flag", "Walk the prompts in a new seeded permutation each epoch (False: file "
        "order); one permutation is shared by all env runners, each serving its share.",
        "data.shuffle")
    data_seed: int | None = knob(
        None, "seed", "Seed of the prompt order (and of generated tasks' problems); None = "
        "the config's seed.", "data.seed")
    minibatch_shuffle_seed: int = knob(
        42, "seed", "With shuffle_batch_per_epoch (verl actor.shuffle), each learner draws its "
        "mini-batches from a permutation per epoch, the first included, seeded with this + "
        "the learner's rank.", _ACTOR + "data_loader_seed")

    # --- multi-turn episodes (envs with env.multi_turn; docs/multi_turn.md) -----------
    max_turns: int | None = knob(
        None, "model turns", "Most model turns per multi-turn episode; an episode still running "
        "after them is truncated (counted in episode/turn_limit_ratio, masked with "
        "mask_truncated_completions). None = the env's own limit. max_response_length is the "
        "episode's whole response budget (model and environment tokens).",
        _ROLLOUT + "multi_turn.max_assistant_turns")
    max_tokens_per_turn: int | None = knob(
        None, "tokens", "Most tokens of one model turn in a multi-turn episode; None = what is "
        "left of max_response_length.")
    max_observation_tokens: int | None = knob(
        None, "tokens", "Longest environment reply (tool result, feedback) in a multi-turn "
        "episode; longer ones are cut. None = only the episode's budget limits it.",
        _ROLLOUT + "multi_turn.max_tool_response_length")

    # --- rollout correction ---------------------------------------------------------
    rollout_is: str | None = knob(
        None, "mode", "Truncated importance sampling against the rollout/trainer mismatch: "
        "None (off) | 'token' (per-token weight min(pi_old/pi_rollout, threshold)) | 'sequence' "
        "(one weight per response: min(product of its tokens' pi_old/pi_rollout, threshold)).",
        "algorithm.rollout_correction.rollout_is")
    rollout_is_threshold: float = knob(
        2.0, "ratio", "Upper bound of the importance weights.",
        "algorithm.rollout_correction.rollout_is_threshold")

    # --- optimizer ------------------------------------------------------------------
    weight_decay: float = knob(0.01, "scalar", "AdamW weight decay.", _ACTOR + "optim.weight_decay")
    betas: tuple = knob((0.9, 0.999), "pair", "AdamW betas.", _ACTOR + "optim.betas")
    lr_warmup_steps: int = knob(
        0, "training steps", "Linear LR warm-up from 0 over this many training steps (learner "
        "updates, whatever dynamic sampling draws); -1 = lr_warmup_steps_ratio x "
        "total_training_steps (verl's default).", _ACTOR + "optim.lr_warmup_steps")
    lr_warmup_steps_ratio: float = knob(
        0.0, "fraction", "Warm-up length as a fraction of total_training_steps, when "
        "lr_warmup_steps is -1.", _ACTOR + "optim.lr_warmup_steps_ratio")
    lr_scheduler_type: str = knob(
        "constant", "name", "LR after warm-up: constant | cosine (decays to min_lr_ratio x lr "
        "at total_training_steps). One scheduler step per training step, as verl.",
        (_ACTOR + "optim.lr_scheduler_type", _ACTOR + "optim.warmup_style"))
    min_lr_ratio: float | None = knob(
        0.0, "fraction", "Floor of the cosine schedule, as a fraction of lr (None = 0).",
        _ACTOR + "optim.min_lr_ratio")
    num_cycles: float = knob(0.5, "cycles", "Cosine waves over the run (0.5 = a half cosine).",
                             _ACTOR + "optim.num_cycles")
    total_training_steps: int | None = knob(
        None, "training steps", "Length of the run for the LR schedule and the last-step "
        "validation; None = the command line's stop training_iteration when known.")

    # --- FSDP -----------------------------------------------------------------------
    fsdp: bool = knob(
        True, "flag", "With num_learners >= 2, shard the model over the learners with FSDP2 "
        "(per decoder layer); False = RLlib's DDP (a full replica per learner). LoRA runs "
        "(lora_rank > 0) always use DDP.")
    fsdp_param_dtype: str = knob(
        "auto", "dtype", "FSDP2 compute/all-gather dtype of the parameters: auto (= model_dtype, "
        "the compute dtype) | model (the master weights' dtype) | bfloat16 | float16 | float32.")
    fsdp_reduce_dtype: str = knob(
        "float32", "dtype", "FSDP2 gradient reduce-scatter dtype: float32 | bfloat16 | model.",
        _ACTOR + "fsdp_config.mixed_precision.reduce_dtype")
    fsdp_cpu_offload: bool = knob(
        False, "flag", "Keep sharded parameters, gradients and optimizer states in host "
        "memory (FSDP2 CPUOffloadPolicy); the optimizer steps on the CPU.",
        (_ACTOR + "fsdp_config.offload_policy", _ACTOR + "fsdp_config.param_offload"))

    # --- LoRA and memory ------------------------------------------------------------
    lora_rank: int = knob(
        0, "rank", "LoRA rank through peft (0 = off, full fine-tuning). With LoRA only the "
        "adapter trains, the reference is the policy with the adapter disabled (no second "
        "copy of the weights) and checkpoints hold the adapter alone.",
        "actor_rollout_ref.model.lora_rank")
    lora_alpha: float = knob(
        16, "scalar", "LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.",
        "actor_rollout_ref.model.lora_alpha")
    lora_target_modules: str | list = knob(
        "all-linear", "module names", "Layers that get an adapter: 'all-linear' (every linear "
        "layer but the output head) or a list of names such as ['q_proj', 'v_proj'].",
        "actor_rollout_ref.model.target_modules")
    lora_dropout: float = knob(
        0.0, "probability", "Dropout on the adapter's input, in the training forward only.")
    lora_sync: str = knob(
        "adapter", "mode", "What reaches the samplers after the first full sync: 'adapter' "
        "(the A and B matrices; each env runner merges W + B@A*alpha/r into its own copy) or "
        "'merged' (the learner sends the merged weights of the adapted layers).")
    ref_param_offload: bool = knob(
        False, "flag", "Keep the reference model in host memory and move it to the learner's "
        "device for each forward (a no-op on CPU learners and with LoRA).",
        "actor_rollout_ref.ref.fsdp_config.param_offload")
    optimizer_offload: bool = knob(
        False, "flag", "Keep AdamW's states in host memory between optimizer steps "
        "(verl actor.fsdp_config.optimizer_offload): moved to the device for the step, back "
        "after it (step hooks from rllib_grpo.models.offload.offload_optimizer_states, installed "
        "by the learner). A no-op on CPU.", _ACTOR + "fsdp_config.optimizer_offload")
    sampler_memory_fraction: float | None = knob(
        None, "fraction of GPU memory", "GPU memory the vLLM engine may take (weights + KV "
        "cache), vLLM's gpu_memory_utilization; None = sampler_config's value, else 0.9 x the "
        "env runner's GPU share when fractional, else vLLM's default.",
        _ROLLOUT + "gpu_memory_utilization")

    # --- weight sync ----------------------------------------------------------------
    weight_sync_transport: str = knob(
        "auto", "name", "How the learner's weights reach the samplers after each step: 'auto' "
        "(by placement: 'local' in one process, 'ipc' on one node's GPUs, 'shm' on one node, "
        "'collective' across nodes), 'local' (device tensors copied in place), 'ipc' (CUDA "
        "IPC handles), 'shm' (buckets through shared memory), 'collective' (buckets "
        "broadcast over a gloo/NCCL group) or 'object_store' (a state dict through Ray, "
        "RLlib's sync_weights; also auto's fallback when no group can be formed).")
    weight_sync_bucket_mb: float = knob(
        512, "MiB", "Size of one weight-sync bucket (in the sampler's dtype): each side of a "
        "'shm' or 'collective' sync holds at most two of them besides the model; a tensor "
        "larger than this travels in a bucket of its own.")

    # --- asynchronous rollouts (docs/async.md) -----------------------------------------
    max_staleness: int = knob(
        0, "learner updates", "0 = synchronous GRPO (sample, update, sync in turn). K >= 1 = "
        "one-step-off-policy: the remote env runners generate the next step's groups while "
        "the learner trains on the current ones, and get the new weights between two "
        "generations; no trajectory older than K learner updates is trained on (its group is "
        "dropped and sampled again, counted in async/dropped_stale_groups). Needs "
        "num_env_runners >= 1. In-flight samples are not checkpointed: a restored run samples "
        "those prompts again.")

    # --- reporting ------------------------------------------------------------------
    peak_tflops: float | None = knob(
        None, "TFLOP/s per learner device", "Peak of one learner device for perf/mfu/actor "
        "(6 x parameters x training tokens/s / peak); None = the bf16 dense peak of known GPUs "
        "by name (rllib_grpo.rllib.perf), and no MFU on CPUs or unknown devices.")
    log_completions_every: int = knob(
        0, "training steps", "Write sampled completions to TensorBoard every N steps (0 = off).")
    warn_no_signal_after: int = knob(
        3, "training steps", "Warn when most groups carry no signal for this many steps.")

    # --- checkpoints and faults -------------------------------------------------------
    keep_checkpoints: int = knob(
        0, "checkpoints", "Keep only this run's newest K checkpoints in the folder "
        "save_to_path writes to (0 = keep all); `rllib train` also passes it to Tune as "
        "num_to_keep. Checkpoints are written atomically with a manifest of checksums.")
    max_skipped_steps: int = knob(
        10, "training steps", "Stop the run when this many training steps in a row learned "
        "nothing: every optimizer step skipped for a non-finite gradient norm, or every "
        "reward call failed (0 = never stop).")
    env_runner_restart_timeout_s: float = knob(
        600.0, "seconds", "How long a training step whose remote env runners are all lost "
        "waits for Ray to restart one (restart_failed_env_runners) before it fails; with a "
        "healthy runner left, the lost share is sampled there at once.")


# verl's spellings of a dtype (verl.utils.torch_dtypes.PrecisionType) -> ours.
DTYPE_SPELLINGS = {"fp32": "float32", "32": "float32", "float32": "float32",
                   "bf16": "bfloat16", "bfloat16": "bfloat16",
                   "fp16": "float16", "16": "float16", "float16": "float16"}


def canonical_dtype(value: Any) -> Any:
    """``"bf16"``/``"fp32"``/... -> ``"bfloat16"``/``"float32"``; anything else unchanged
    (the checks name the field of an unknown one)."""
    return DTYPE_SPELLINGS.get(str(value).lower(), value) if isinstance(value, str | int) \
        and not isinstance(value, bool) else value


def is_dtype_setting(name: str) -> bool:
    """A setting whose value is a dtype name (unit ``dtype``)."""
    field_ = SETTINGS_FIELDS.get(name)
    return field_ is not None and field_.metadata["unit"] == "dtype"


# Settings the RLModule receives in its model_config (LoRA and memory levers).
MODULE_SETTINGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout", "lora_sync",
                   "ref_param_offload", "use_remove_padding")

SETTINGS_FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(GRPOSettings)
}

# Unit-bearing verl names that differ from ours (verl name -> our name).
VERL_ALIASES: dict[str, str] = {
    verl_name: name
    for name, f in SETTINGS_FIELDS.items()
    for verl_name in f.metadata["verl"]
}
# verl names that map onto RLlib's own AlgorithmConfig attributes.
VERL_ALIASES.update({
    _ACTOR + "optim.lr": "lr",
    _ACTOR + "ppo_epochs": "num_epochs",
    _ACTOR + "grad_clip": "grad_clip",
    _ACTOR + "shuffle": "shuffle_batch_per_epoch",
    "algorithm.gamma": "gamma",
})


# RLlib fields that GRPO derives from its own settings (refused by name from Python and
# from the command line), with the formula.
DERIVED_FIELDS: dict[str, str] = {
    "train_batch_size": "prompts_per_step x group_size",
    "train_batch_size_per_learner": "prompts_per_step x group_size / num_learners",
    "minibatch_size": "prompts_per_minibatch x group_size",
}


def derived_field_error(name: str) -> str:
    """The message refusing the derived field ``name``."""
    return (f"{name!r} is derived for GRPO ({DERIVED_FIELDS[name]}); set prompts_per_step, "
            "prompts_per_minibatch or group_size instead.")


def settings_table() -> str:
    """Every GRPO setting as a Markdown table: name, type, default, unit, verl name, meaning."""
    rows = ["| field | type | default | unit | verl | meaning |", "|---|---|---|---|---|---|"]
    for name, f in SETTINGS_FIELDS.items():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        verl = ", ".join(f"`{v}`" for v in f.metadata["verl"])
        doc, kind = (str(text).replace("|", "\\|") for text in (f.metadata["doc"], f.type))
        rows.append(f"| `{name}` | `{kind}` | `{default!r}` | {f.metadata['unit']} | {verl} "
                    f"| {doc} |")
    return "\n".join(rows) + "\n"


CONFIGURATION_DOC_HEADER = """# Configuration: every GRPO field

Generated from `rllib_grpo/rllib/settings.py` (the one source of truth) by
`python -m rllib_grpo.rllib.settings > docs/configuration.md`; `tests/test_config.py`
checks that this file is up to date.  `GRPOConfig` inherits these fields as typed
attributes; `.training(...)` sets them (and RLlib's own: `lr`, `grad_clip`, `num_epochs`,
...); the verl names are accepted as aliases in Python, YAML and on the command line.
RLlib's `train_batch_size`, `train_batch_size_per_learner` and `minibatch_size` are derived
from `prompts_per_step`, `prompts_per_minibatch` and `group_size` and refused by name.

"""


def configuration_doc() -> str:
    """The text of ``docs/configuration.md``: a short header and `settings_table`."""
    return CONFIGURATION_DOC_HEADER + settings_table()


def defaults() -> dict[str, Any]:
    """Fresh default values of every GRPO setting."""
    return dataclasses.asdict(GRPOSettings())


if __name__ == "__main__":
    print(configuration_doc(), end="")
