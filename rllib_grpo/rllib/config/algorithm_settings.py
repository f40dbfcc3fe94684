"""The algorithm's settings: batch plan, model, sampling, advantage, loss, recipes,
validation, data order, multi-turn episodes, rollout correction and optimizer.

`AlgorithmSettings` is the first half of `rllib_grpo.rllib.config.settings.GRPOSettings` (which
adds the system's: FSDP, LoRA and memory, weight sync, asynchronous rollouts, reporting,
checkpoints and faults); `knob` declares a field with its unit, doc and verl names.  Split
only for size: the fields keep one order (this half first) and one table
(`rllib_grpo.rllib.config.settings.SETTINGS_FIELDS`).  No Ray here.
"""

from __future__ import annotations

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
class AlgorithmSettings:
    """The algorithm's GRPO settings with their units (the first half of `GRPOSettings`)."""

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
    use_dynamic_bsz: bool | None = knob(
        None, "flag", "Build micro-batches to a token budget (max_tokens_per_micro_batch) "
        "instead of a fixed size. None = on where the learners hold GPUs "
        "(num_gpus_per_learner > 0) and micro_batch_size_per_learner is unset, as verl's "
        "examples run; off on CPUs, where whole mini-batches are faster "
        "(GRPOSettings.micro_batches_by_tokens).", _ACTOR + "use_dynamic_bsz")
    max_tokens_per_micro_batch: int = knob(
        16384, "tokens", "Token budget of one micro-batch (real prompt + response tokens) "
        "when micro-batches are built to a budget; must be >= max_prompt_length + "
        "max_response_length.", _ACTOR + "ppo_max_token_len_per_gpu")
    use_remove_padding: bool = knob(
        True, "flag", "Run every learner forward (old log-prob, reference, update) on packed "
        "rows: the sequences' real tokens concatenated, positions restarting per sequence, "
        "attention confined to each sequence (rllib_grpo.models.packing); False = padded rows "
        "with attention masks. The log-probs and the update are the same either way.",
        "actor_rollout_ref.model.use_remove_padding")
    share_prompt_prefix: bool = knob(
        True, "flag", "With use_remove_padding and a dense-mask attention (sdpa, the CPU "
        "default): the responses of one prompt share a single copy of it in the packed rows, "
        "each attending to the prompt and to itself only (rllib_grpo.models.shared_prefix); "
        "the log-probs, loss and gradients are the unshared ones, with the prompt's tokens "
        "computed once per group instead of once per response.")
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
        "auto", "dtype", "Compute and sampling dtype: auto | float32 | bfloat16 (| float16). "
        "auto = bfloat16 when the learners hold GPUs (num_gpus_per_learner > 0), float32 on "
        "CPUs (a configuration in verl's keys starts from bfloat16, verl's default). With "
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
    gradient_checkpointing: bool | None = knob(
        None, "flag", "Keep one hidden state per decoder layer and recompute the rest in "
        "backward (memory for ~a third more compute). None = on where the learners hold "
        "GPUs and the memory plan's activations of one micro-batch are the update's largest "
        "item (GRPOSettings.checkpoints_activations); off on CPUs.",
        "actor_rollout_ref.model.enable_gradient_checkpointing")
    freeze_vision_tower: bool = knob(
        False, "flag", "A vision-language model trains its language model only: the vision "
        "tower (and its merger) gets no gradient and no optimizer state; the samplers keep "
        "the tower they loaded. False = the tower trains and every weight sync carries it.",
        _ACTOR + "freeze_vision_tower")
    model_override_config: dict = knob(
        {}, "dict", "Entries overriding the model's HF config (e.g. max_position_embeddings) "
        "in the learner, the reference and the samplers (vLLM hf_overrides); verl's "
        "actor_rollout_ref.model.override_config.*.")

    # --- sampling -------------------------------------------------------------------
    sampler: str = knob(
        "auto", "name", "Sampler: auto (vLLM where it is installed, else transformers) | vllm | hf. "
        "Samples are reproducible when the config has a seed (.debugging(seed=...)): every "
        "vLLM request is then seeded; without one vLLM's requests draw from the engine's RNG "
        "(seeded requests make vLLM's GPU sampler draw request by request).",
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
    val_num_prompts: int | None = knob(
        None, "prompts", "Held-out prompts per validation (the first of the held-out order, "
        "each once); None = the whole held-out set (verl). evaluation_duration, when set, "
        "takes precedence.")
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
