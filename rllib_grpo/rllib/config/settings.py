"""Every GRPO knob in one table: type, default, unit, meaning and verl names.

`GRPOConfig` takes its GRPO-specific attributes from `GRPOSettings`, whose fields are
declared with `knob` (default, unit, doc, verl names) in the order of the docs: the
algorithm's (batch plan, model, sampling, advantage, loss, recipes, validation, data order,
multi-turn episodes, rollout correction, optimizer), the rewards', then the system's (FSDP,
LoRA and memory, weight sync, asynchronous rollouts, reporting, checkpoints and faults).
`SETTINGS_FIELDS` is that table; its ``verl`` metadata maps verl's dotted names onto the
fields (one mechanism for `explain`, the verl aliases of the command line and the docs).
Where verl has a name for one of RLlib's own fields, `EVALUATION_ALIASES` and
`VERL_ALIASES` point at that field instead of adding a second knob.  No Ray here.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rllib_grpo.rllib.config.gpu_layout import PlacementPlan
    from rllib_grpo.samplers import SamplingParams

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
_RM = "reward_model."
_NEW_RM = "reward.reward_model."  # newer verl nests the reward model under reward.


@dataclass(frozen=True)
class BatchPlan:
    """The resolved sizes of one training step (units in the names)."""

    prompts_per_step: int
    trajectories_per_step: int
    prompts_per_minibatch: int
    trajectories_per_minibatch: int
    num_learners: int
    trajectories_per_learner: int
    trajectories_per_minibatch_per_learner: int
    micro_batch_size_per_learner: int
    micro_batches_per_minibatch: int
    minibatches_per_epoch: int
    optimizer_steps_per_step: int


# `evaluation_duration` meaning "every held-out prompt, once" (RLlib validates an int > 0).
WHOLE_HELD_OUT_SET = 2**31 - 1


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
    val_before_train: bool = knob(
        False, "flag", "Evaluate once before the first training step (verl's default: on).",
        "trainer.val_before_train")
    val_env_config: dict = knob(
        {}, "dict", "env_config overrides of the held-out env (e.g. another data_seed or path).")
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

    # --- rewards (docs/reward-models.md) ----------------------------------------------
    reward_funcs: list | None = knob(
        None, "rewards", "TRL-style list of rewards whose weighted sum is the score: None or "
        "'env' (the env's own reward: env_config.reward_fn, else each row's data_source), a "
        "function or 'module:function' or a registered scorer name, a reward model (any other "
        "string: a folder, built-in or cached hub id of a sequence-classification model), "
        "'http://...' (a remote reward in OpenRLHF's protocol), or a dict with 'type' "
        "(model, judge, remote, function; docs/reward-models.md). None = the env's reward "
        "alone. Each is logged as reward/<name>/mean.")
    reward_weights: list | None = knob(
        None, "weights", "One weight per entry of reward_funcs (TRL's reward_weights); None = "
        "1 each.")
    reward_model_enable: bool = knob(
        False, "flag", "verl's reward model switch: score with the model at "
        "reward_model_path instead of the rule reward (reward_funcs=[reward_model_path]).",
        (_RM + "enable", _NEW_RM + "enable"))
    reward_model_path: str | None = knob(
        None, "model", "verl's reward model: a sequence-classification model (folder, "
        "built-in or cached hub id), used when reward_model_enable is on.",
        (_RM + "model.path", _NEW_RM + "model_path"))
    num_reward_workers: int = knob(
        1, "actors", "Ray actors per reward model or local judge; each env-runner batch goes "
        "to one of them in a single call.")
    num_gpus_per_reward_worker: float = knob(
        0, "GPUs", "GPUs each reward actor holds (0 = it runs on CPU); fractional shares "
        "colocate it with other actors.")
    reward_batch_size: int = knob(
        64, "samples", "Samples per forward pass of a reward model or judge on its actor.",
        (_RM + "micro_batch_size_per_gpu", _NEW_RM + "micro_batch_size_per_gpu"))
    reward_model_dtype: str = knob(
        "auto", "dtype", "Weights dtype of reward models and local judges: auto (bfloat16 on "
        "GPU actors, float32 on CPU ones) | float32 | bfloat16 | float16.")
    reward_model_timeout_s: float = knob(
        300.0, "seconds", "How long one batch call to a reward actor or endpoint may take; "
        "a call past it scores its batch 0 (counted, the actor restarted).")

    # --- FSDP -----------------------------------------------------------------------
    fsdp: bool = knob(
        True, "flag", "With num_learners >= 2, shard the model over the learners with FSDP2 "
        "(per decoder layer); False = RLlib's DDP (a full replica per learner). LoRA runs "
        "(lora_rank > 0) always use DDP.")
    fsdp_param_dtype: str = knob(
        "auto", "dtype", "FSDP2 compute/all-gather dtype of the parameters: auto (= the compute "
        "dtype, model_dtype resolved) | model (the master weights' dtype) | bfloat16 | float16 | "
        "float32.")
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
        False, "flag", "Keep the reference model in host memory (pinned on GPU machines) and "
        "move it to the learner's device once per reference pass (a no-op on CPU learners and "
        "with LoRA); under FSDP each learner keeps only its shard, and each layer visits the "
        "device for its forward.",
        "actor_rollout_ref.ref.fsdp_config.param_offload")
    optimizer_offload: bool = knob(
        False, "flag", "Keep AdamW's states in host memory between optimizer steps "
        "(verl actor.fsdp_config.optimizer_offload): moved to the device for the step, back "
        "after it (step hooks from rllib_grpo.models.offload.offload_optimizer_states, installed "
        "by the learner). A no-op on CPU.", _ACTOR + "fsdp_config.optimizer_offload")
    keep_freed_host_memory: bool = knob(
        True, "flag", "CPU learners: memory that tensors free stays in the process for the "
        "next step's tensors instead of going back to the kernel (glibc's malloc: no mmap "
        "for large blocks, no trim; rllib_grpo.rllib.cpu_tuning). Spares the page faults "
        "of the logits and activations every step; the process's resident memory "
        "then stays at its peak, and the peak grows. A no-op on GPU learners and where the "
        "C library is not glibc.")
    token_stats: str | None = knob(
        None, "mode", "How the learner gets response log-probs and entropies from the "
        "model's last hidden states (rllib_grpo.models.lm_head). None = 'auto' where the "
        "learners hold GPUs (no full float32 copy of the logits), 'full' on CPUs "
        "(GRPOSettings.learner_token_stats). 'auto' = 'fused' where the "
        "model allows it (a plain llama / mistral / qwen2 / qwen3 head, no FSDP, no LoRA), "
        "else 'chunked'; 'fused' = chunks of tokens through the LM head with a hand-written "
        "backward, the full (tokens, vocabulary) logits never stored; 'chunked' = the model's "
        "logits, then the softmax statistics a chunk of tokens at a time; 'full' = one "
        "float32 log-softmax over all response logits under autograd. The same "
        "values to float32 rounding.")
    gpu_memory_gib: float = knob(
        79.2, "GiB", "Memory of one GPU as CUDA reports it (torch.cuda.mem_get_info's "
        "total; 79.2 on an 80 GB H100 or A100). The memory plan (explain, dry-run) checks "
        "every GPU's processes against it in each phase of a step, and a phase that does not "
        "fit is an error before Ray starts; explain and dry-run take --gpu-memory.")
    sampler_memory_fraction: float | None = knob(
        None, "fraction of GPU memory", "GPU memory the vLLM engine may take (weights + KV "
        "cache), vLLM's gpu_memory_utilization; None = sampler_config's value, else 0.5 when "
        "the engine shares the local learner's GPU (it sleeps during the update), else 0.9 x "
        "the env runner's GPU share when fractional, else vLLM's default (0.9).",
        _ROLLOUT + "gpu_memory_utilization")

    startup_timeout_s: float = knob(
        1800, "seconds", "How long a run's start may take: Tune's start of the trial, the "
        "placement group, the reward workers, the env runners with their engines and the "
        "learners, each placed and built (a 70B model loaded), before the run stops naming "
        "what it waits on, with every process's Python stack in a file (docs/hangs.md).")
    gpus_per_node: int = knob(
        0, "GPUs", "GPUs per node of the cluster the run is planned for (verl "
        "trainer.n_gpus_per_node): explain and dry-run print each GPU by node, and colocated "
        "engines of tensor parallel > 1 must tile whole nodes. 0 = not stated (one node in "
        "explain; the run tiles the nodes Ray gives it).")
    num_nodes: int = knob(
        0, "nodes", "Nodes of the cluster the run is planned for (verl trainer.nnodes); with "
        "gpus_per_node, a run that needs more GPUs than num_nodes x gpus_per_node (a reward "
        "model on a GPU of its own, say) is refused before Ray starts. 0 = not stated.")

    # --- weight sync ----------------------------------------------------------------
    weight_sync_transport: str = knob(
        "auto", "name", "How the learners' weights reach the samplers after each step: 'auto' "
        "(by placement: 'local' in one process; 'ipc' for a vLLM engine on the learners' GPUs, "
        "'nccl' for one on GPUs of its own, both vLLM's weight-transfer engines; 'shm' on the "
        "learner's node otherwise; 'object_store' beyond it, for LoRA and for the driver's "
        "env runner), or one of those forced: 'local' (device tensors copied in place), "
        "'ipc' (CUDA IPC buffers), 'nccl' (broadcast), 'shm' (one shared-memory copy on the "
        "node) or 'object_store' (a state dict through Ray, RLlib's way). explain prints "
        "what each env runner gets. Each call of a sync has the step's deadline "
        "(step_timeout_factor): an env runner past it is restarted and left out of the sync, "
        "a learner past it stops the run.")
    weight_sync_connect_timeout_s: float = knob(
        300.0, "seconds", "How long learner 0 and the vLLM engines' workers may take to form "
        "the NCCL weight group (the first sync of engines on GPUs of their own, 'nccl'). Past "
        "it the run stops with one line naming the host and port of learner 0's NCCL "
        "bootstrap and what to open between the nodes (a cluster that opens only Ray's ports "
        "cannot form the group); weight_sync_transport='object_store' needs no such port.")

    # --- asynchronous rollouts (docs/async.md) -----------------------------------------
    max_staleness: int = knob(
        0, "learner updates", "0 = synchronous GRPO (sample, update, sync in turn). K >= 1 = "
        "one-step-off-policy: the remote env runners generate the next step's groups while "
        "the learner trains on the current ones, and get the new weights between two "
        "generations; no trajectory older than K learner updates is trained on (its group is "
        "dropped and sampled again, counted in async/dropped_stale_groups). Needs "
        "num_env_runners >= 1. In-flight samples are not checkpointed: a restored run samples "
        "those prompts again. With rollout_mode='continuous' K bounds every trained token's "
        "staleness and sets how many steps of groups are in flight.")
    rollout_mode: str = knob(
        "auto", "name", "'auto' ('sync' at max_staleness=0, else 'one_step_off') | 'sync' | "
        "'one_step_off' (the next step's groups sampled during the update; weights between "
        "generations) | 'continuous' (env runners never stop: up to max_staleness steps' worth "
        "of groups in flight, finished groups stream to the learner, weights loaded between "
        "two decode steps; vLLM sampler, single-turn envs).")
    partial_rollout: bool = knob(
        True, "bool", "rollout_mode='continuous': a response unfinished at a weight update "
        "continues under the new weights (each token keeps the version that sampled it); "
        "False samples it again from its prompt.")

    def resolved_rollout_mode(self) -> str:
        """``rollout_mode`` with 'auto' resolved from ``max_staleness``."""
        if self.rollout_mode != "auto":
            return self.rollout_mode
        return "one_step_off" if self.max_staleness else "sync"

    # --- reporting ------------------------------------------------------------------
    loggers: tuple = knob(
        ("console", "tensorboard"), "names", "Where `rllib train` logs metrics: console, "
        "tensorboard, wandb, mlflow (Tune's logger callbacks; wandb and mlflow need their "
        "package installed).", "trainer.logger")
    log_completions_every: int = knob(
        0, "training steps", "Write sampled completions to TensorBoard every N steps (0 = off).")

    # --- checkpoints and faults -------------------------------------------------------
    keep_checkpoints: int = knob(
        0, "checkpoints", "Keep only this run's newest K checkpoints in the folder "
        "save_to_path writes to (0 = keep all); `rllib train` also passes it to Tune as "
        "num_to_keep. Checkpoints are written atomically with a manifest of checksums.")
    max_skipped_steps: int = knob(
        10, "training steps", "Stop the run when this many training steps in a row learned "
        "nothing: every optimizer step skipped for a non-finite gradient norm, or every "
        "reward call failed (0 = never stop).")
    step_timeout_factor: float = knob(
        10.0, "x median", "A wait of a training step (an env runner's sampling, the learners' "
        "update, an evaluation, a checkpoint write, a weight sync) may last this many times "
        "the median of the same wait so far, at least step_timeout_floor_s. Past it the run "
        "names the stuck process and writes every process's Python stack to the trial "
        "folder; a stuck env runner is restarted and its share sampled again, anything else "
        "stops the run (docs/hangs.md).")
    step_timeout_floor_s: float = knob(
        3600.0, "seconds", "The least time a wait of a training step gets before it counts "
        "as a hang (step_timeout_factor), and the whole deadline of the first wait of each "
        "kind, which has no median yet: long enough for a slow first step of a large "
        "model.")
    env_runner_restart_timeout_s: float = knob(
        600.0, "seconds", "How long a training step whose remote env runners are all lost "
        "waits for Ray to restart one (restart_failed_env_runners) before it fails; with a "
        "healthy runner left, the lost share is sampled there at once.")

    if TYPE_CHECKING:
        # RLlib's own fields that GRPO's checks and plans read: `AlgorithmConfig` holds them
        # at run time (`GRPOConfig` inherits both); declared for the type checker only, so
        # the checks can be typed with this class.  Not GRPO settings: not in the table.
        num_env_runners: int = 0
        num_learners: int = 0
        num_gpus_per_learner: float = 0
        num_gpus_per_env_runner: float = 0
        num_cpus_per_learner: float | str = "auto"
        num_cpus_per_env_runner: float = 1
        num_cpus_for_main_process: float = 1
        placement_strategy: str = "PACK"
        num_epochs: int = 1
        shuffle_batch_per_epoch: bool = False
        lr: Any = None
        env: Any = None
        env_config: dict = {}
        seed: int | None = None
        evaluation_interval: int | None = None
        evaluation_duration: int | str = WHOLE_HELD_OUT_SET

        def placement_plan(self) -> PlacementPlan:
            """`GRPOConfig.placement_plan`."""
            raise NotImplementedError

    # ------------------------------------- RLlib's evaluation fields by verl's names
    @property
    def val_every(self) -> int:
        """RLlib's ``evaluation_interval`` (`EVALUATION_ALIASES`); 0 = never."""
        return self.evaluation_interval or 0

    @val_every.setter
    def val_every(self, steps: int) -> None:
        # verl's test_freq=-1 is "never": RLlib's never is None (any other value evaluates).
        self.evaluation_interval = steps if steps > 0 else None

    @property
    def val_num_prompts(self) -> int | None:
        """RLlib's ``evaluation_duration`` in prompts (`EVALUATION_ALIASES`); None = the
        whole held-out set."""
        duration = self.evaluation_duration
        return duration if isinstance(duration, int) and duration != WHOLE_HELD_OUT_SET \
            else None

    @val_num_prompts.setter
    def val_num_prompts(self, prompts: int | None) -> None:
        self.evaluation_duration = WHOLE_HELD_OUT_SET if prompts is None else prompts

    # ---------------------------------------------------------------- derived values
    @property
    def learners_on_gpus(self) -> bool:
        """The learners hold GPUs (``num_gpus_per_learner > 0``): the one switch between the
        CPU and the GPU defaults of ``model_dtype``, ``use_dynamic_bsz``, ``token_stats`` and
        ``gradient_checkpointing``."""
        return (getattr(self, "num_gpus_per_learner", 0) or 0) > 0

    @property
    def compute_dtype(self) -> str:
        """``model_dtype`` resolved: ``auto`` is bfloat16 (over fp32 master weights, as verl)
        when the learners hold GPUs, float32 on CPUs (bf16 matmuls are slow there)."""
        if self.model_dtype != "auto":
            return self.model_dtype
        return "bfloat16" if self.learners_on_gpus else "float32"

    @property
    def micro_batches_by_tokens(self) -> bool:
        """``use_dynamic_bsz`` resolved: None is a token budget per micro-batch on GPU
        learners (verl's examples; one micro-batch of a whole mini-batch runs out of memory
        there) unless ``micro_batch_size_per_learner`` is set; whole mini-batches on CPUs."""
        if self.use_dynamic_bsz is not None:
            return bool(self.use_dynamic_bsz)
        return self.learners_on_gpus and self.micro_batch_size_per_learner is None

    @property
    def learner_token_stats(self) -> str:
        """``token_stats`` resolved: None is 'auto' on GPU learners (chunked log-softmax and
        entropy, no full float32 copy of the logits), 'full' on CPUs."""
        if self.token_stats is not None:
            return self.token_stats
        return "auto" if self.learners_on_gpus else "full"

    @property
    def checkpoints_activations(self) -> bool:
        """``gradient_checkpointing`` resolved: None is on for GPU learners where the memory
        plan's activations of one micro-batch are the update's largest item
        (`rllib_grpo.rllib.config.learner_memory.activations_dominate`; on where the model's
        shape is unknown), off on CPUs."""
        if self.gradient_checkpointing is not None:
            return bool(self.gradient_checkpointing)
        if not self.learners_on_gpus:
            return False
        from rllib_grpo.rllib.config.learner_memory import activations_dominate, config_shape

        try:
            shape = config_shape(self)
        except Exception:  # noqa: BLE001  (no shape to plan with: the safe side)
            return True
        return activations_dominate(self, shape)

    @property
    def sampler_dtype(self) -> str:
        """The samplers' weight dtype: ``sampler_config["dtype"]`` if set (and not "auto"),
        else the compute dtype; weight syncs are cast to it on the learner."""
        dtype = canonical_dtype(dict(self.sampler_config).get("dtype") or "auto")
        return self.compute_dtype if dtype == "auto" else dtype

    @property
    def sampler_sleeps(self) -> bool:
        """The vLLM engines share the learners' GPUs (`layout.shares_learner_gpus`: the
        local env runner with the local learner on a GPU, or verl's colocated layout), so
        they sleep during each update (KV cache and weights released) and wake before the
        weight sync."""
        from rllib_grpo.rllib.config.gpu_layout import shares_learner_gpus

        return self.sampler != "hf" and shares_learner_gpus(self)

    @property
    def needs_reference(self) -> bool:
        """A frozen reference model is needed when any KL term is on."""
        return bool(self.use_kl_loss or self.use_kl_in_reward)

    def validation_sampling(self) -> SamplingParams:
        """verl's ``val_kwargs``: greedy unless ``val_do_sample`` (None: sample when
        ``val_temperature > 0``), then ``val_temperature``/``val_top_p``/``val_top_k``."""
        from rllib_grpo.samplers import SamplingParams

        sample = self.val_do_sample if self.val_do_sample is not None else self.val_temperature > 0
        if not sample:
            return SamplingParams(temperature=0.0, max_tokens=self.max_response_length)
        return SamplingParams(temperature=self.val_temperature, top_p=self.val_top_p,
                              top_k=self.val_top_k, max_tokens=self.max_response_length)

    @property
    def loss_horizon(self) -> float:
        """Horizon of seq-mean-token-sum-norm (verl `loss_scale_factor`)."""
        return float(self.loss_scale_factor or self.max_response_length)

    def batch_plan(self) -> BatchPlan:
        """Resolve the sizes of a training step (does not validate them)."""
        num_learners = max(1, self.num_learners)
        prompts_mb = self.prompts_per_minibatch or self.prompts_per_step
        traj_step = self.prompts_per_step * self.group_size
        traj_mb = prompts_mb * self.group_size
        traj_mb_learner = traj_mb // num_learners
        micro = self.micro_batch_size_per_learner or traj_mb_learner
        minibatches = self.prompts_per_step // prompts_mb if prompts_mb else 0
        return BatchPlan(
            prompts_per_step=self.prompts_per_step,
            trajectories_per_step=traj_step,
            prompts_per_minibatch=prompts_mb,
            trajectories_per_minibatch=traj_mb,
            num_learners=num_learners,
            trajectories_per_learner=traj_step // num_learners,
            trajectories_per_minibatch_per_learner=traj_mb_learner,
            micro_batch_size_per_learner=micro,
            micro_batches_per_minibatch=max(1, traj_mb_learner // micro) if micro else 0,
            minibatches_per_epoch=minibatches,
            optimizer_steps_per_step=minibatches * self.num_epochs,
        )


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
                   "ref_param_offload", "use_remove_padding",
                   "share_prompt_prefix", "freeze_vision_tower")

SETTINGS_FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(GRPOSettings)
}


@dataclass(frozen=True)
class Alias:
    """A name of one of RLlib's own fields (the property of the same name on
    `GRPOSettings` reads and writes it), with its type, default, unit, doc and verl names."""

    field: str
    type: str
    default: Any
    unit: str
    doc: str
    verl: tuple[str, ...] = ()


# verl's validation settings that RLlib has as evaluation fields: one value, two names.
EVALUATION_ALIASES: dict[str, Alias] = {
    "val_every": Alias(
        "evaluation_interval", "int", 0, "training steps", "Evaluate on held-out prompts "
        "every N steps and at the last step (total_training_steps); <= 0 = never (verl's "
        "test_freq=-1, RLlib's None).", ("trainer.test_freq",)),
    "val_num_prompts": Alias(
        "evaluation_duration", "int | None", None, "prompts", "Held-out prompts per "
        "validation (the first of the held-out order, each once); None = the whole held-out "
        "set (verl)."),
}

# Unit-bearing verl names that differ from ours (verl name -> our name).
VERL_ALIASES: dict[str, str] = {
    verl_name: name
    for name, f in SETTINGS_FIELDS.items()
    for verl_name in f.metadata["verl"]
}
VERL_ALIASES.update({verl_name: name for name, alias in EVALUATION_ALIASES.items()
                     for verl_name in alias.verl})
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


# `loggers` names -> the package each needs (console and TensorBoard come with Ray).
LOGGER_PACKAGES: dict[str, str | None] = {"console": None, "tensorboard": None,
                                          "wandb": "wandb", "mlflow": "mlflow"}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` Did you mean 'group_size'?`` for a misspelt ``name`` (difflib's nearest among
    ``known``, up to three), or ``""`` when none is near."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.75)
    return f" Did you mean {' or '.join(map(repr, near))}?" if near else ""


def choice_error(field: str, value: Any, choices: Iterable[Any], *, listed: str | None = None,
                 note: str = "") -> str | None:
    """The one refusal of every choice-valued setting, or None when ``value`` is one of
    ``choices``: ``field='x' is unknown; use one of: a, b (note). Did you mean 'a'?``.
    ``listed`` replaces the list of choices shown (where they are many and follow a rule);
    the suggestion is the nearest of all of them (`did_you_mean`)."""
    choices = tuple(choices)
    if value in choices:
        return None
    shown = listed if listed is not None else ", ".join(map(str, choices))
    return (f"{field}={value!r} is unknown; use one of: {shown}{note}."
            + did_you_mean(str(value), [str(choice) for choice in choices]))


def _row(cells: Iterable[str]) -> str:
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def settings_table() -> str:
    """Every GRPO setting as a Markdown table: name, type, default, unit, verl name, meaning."""
    rows = ["| field | type | default | unit | verl | meaning |", "|---|---|---|---|---|---|"]
    for name, f in SETTINGS_FIELDS.items():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        verl = ", ".join(f"`{v}`" for v in f.metadata["verl"])
        rows.append(_row([f"`{name}`", f"`{f.type}`", f"`{default!r}`", f.metadata["unit"],
                          verl, f.metadata["doc"]]))
    return "\n".join(rows) + "\n"


def aliases_table() -> str:
    """`EVALUATION_ALIASES` as a Markdown table: name, RLlib's field, type, default, unit,
    verl name, meaning."""
    rows = ["| name | RLlib field | type | default | unit | verl | meaning |",
            "|---|---|---|---|---|---|---|"]
    for name, alias in EVALUATION_ALIASES.items():
        rows.append(_row([f"`{name}`", f"`{alias.field}`", f"`{alias.type}`",
                          f"`{alias.default!r}`", alias.unit,
                          ", ".join(f"`{v}`" for v in alias.verl), alias.doc]))
    return "\n".join(rows) + "\n"


CONFIGURATION_DOC_HEADER = """# Configuration: every GRPO field

Generated from `rllib_grpo/rllib/config/settings.py` (the one source of truth) by
`python -m rllib_grpo.rllib.config.settings > docs/configuration.md`; `tests/rllib/config/test_config.py`
checks that this file is up to date.  `GRPOConfig` inherits these fields as typed
attributes; `.training(...)` sets them (and RLlib's own: `lr`, `grad_clip`, `num_epochs`,
...); the verl names are accepted as aliases in Python, YAML and on the command line.
RLlib's `train_batch_size`, `train_batch_size_per_learner` and `minibatch_size` are derived
from `prompts_per_step`, `prompts_per_minibatch` and `group_size` and refused by name.
RLlib's `create_local_env_runner` is, unless set, True only with `num_env_runners=0`: GRPO
samples and validates on the remote env runners wherever there are any, so the driver holds
no sampler (a model copy, a vLLM engine) beside them.

**CPU and GPU defaults.** Four settings default to a value that depends on where the
learners run, decided in one place (`GRPOSettings.learners_on_gpus`: `num_gpus_per_learner
> 0`) and printed by `rllib-grpo explain` ("learner memory settings"):

| setting | GPU learners | CPU learners |
|---|---|---|
| `model_dtype` (`auto`) | bfloat16 compute over fp32 master weights | float32 |
| `use_dynamic_bsz` (`None`) | a token budget per micro-batch (`max_tokens_per_micro_batch`), unless `micro_batch_size_per_learner` is set | whole mini-batches |
| `token_stats` (`None`) | `'auto'`: chunked (or fused) log-softmax and entropy, no full float32 copy of the logits | `'full'` |
| `gradient_checkpointing` (`None`) | on where the memory plan's activations of one micro-batch are the update's largest item (above the weights, gradients, AdamW states, reference and logits each) | off |

A value set explicitly is kept.  On GPUs the memory plan (`rllib_grpo.rllib.config.memory`,
docs/gpus.md) checks every GPU against `gpu_memory_gib` before Ray starts.

"""


ALIASES_DOC_HEADER = """
## verl's names for RLlib's evaluation fields

These set RLlib's own field (`.evaluation(...)` sets the same value); `.training(...)`, YAML
and the command line accept the name and its verl key.  The other validation settings
(`val_n`, `val_temperature`, ...) above are read from RLlib's evaluation copy of the config,
so `evaluation_config={...}` overrides them as it does any field.

"""


def configuration_doc() -> str:
    """The text of ``docs/configuration.md``: a short header, `settings_table` and
    `aliases_table`."""
    return CONFIGURATION_DOC_HEADER + settings_table() + ALIASES_DOC_HEADER + aliases_table()


def defaults() -> dict[str, Any]:
    """Fresh default values of every GRPO setting."""
    return dataclasses.asdict(GRPOSettings())


if __name__ == "__main__":
    print(configuration_doc(), end="")
