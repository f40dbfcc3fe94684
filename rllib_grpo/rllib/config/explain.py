"""`explain_config`: what a GRPO configuration will actually do, as text: the resolved batch
plan, the loss and KL set-up, the memory plan, and every error and pitfall found."""

from __future__ import annotations

from rllib_grpo.rllib.config.checks import find_errors, find_pitfalls, reward_fn_probe_lines
from rllib_grpo.rllib.config.gpu_layout import layout_lines, planned_transports
from rllib_grpo.rllib.config.memory import memory_lines
from rllib_grpo.rllib.config.prompt_lengths import prompt_length_lines
from rllib_grpo.rllib.config.reward_plan import reward_plan_lines
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.staleness import async_line
from rllib_grpo.rllib.config.vision_plan import vision_lines
from rllib_grpo.weights.plan import describe, who_takes


def _lora_line(c: GRPOSettings) -> str:
    if c.lora_rank <= 0:
        return "LoRA: off (full fine-tuning)"
    return (f"LoRA: rank {c.lora_rank}, alpha {c.lora_alpha} (scale {c.lora_alpha / c.lora_rank:g})"
            f", targets {c.lora_target_modules}; reference = the policy with the adapter "
            f"disabled; sync: full weights once, then {c.lora_sync}")


def _precision_line(c: GRPOSettings) -> str:
    """Where each dtype lives: master weights, compute, reference, samplers."""
    if c.lora_rank > 0:
        master = f"LoRA adapter in float32, frozen base in {c.compute_dtype}"
    else:
        master = f"{c.master_weights_dtype} master weights, gradients and AdamW states"
        if c.master_weights_dtype == "bfloat16":
            master += " (pure bf16, see PITFALLS)"
    compute = c.compute_dtype
    if c.compute_dtype != "float32" and (c.master_weights_dtype == "float32" or c.lora_rank > 0):
        compute += " (autocast on one learner; FSDP2 MixedPrecisionPolicy when sharded, " \
                   f"gradients reduced in {c.fsdp_reduce_dtype})"
    return (f"precision:                     {master}; compute in {compute}; reference in "
            f"{c.compute_dtype}; samplers get {c.sampler_dtype} weights")
def _memory_defaults_line(c: GRPOSettings) -> str:
    """How the settings left to the device resolved (``learners_on_gpus``)."""
    where = ("GPU learners (num_gpus_per_learner > 0)" if c.learners_on_gpus
             else "CPU learners")

    def told(field: str, value: str) -> str:
        return f"{field}={value}" + ("" if getattr(c, field) is not None else " (default)")

    return (f"learner memory settings:       {where}: "
            + ", ".join([told("use_dynamic_bsz", str(c.micro_batches_by_tokens)),
                         told("token_stats", repr(c.learner_token_stats)),
                         told("gradient_checkpointing", str(c.checkpoints_activations))]))


def _weight_sync_line(c: GRPOSettings) -> str:
    """What each env runner's weights take, as the run's planner picks it for the placement
    plan's places (`planned_transports`), and what moves on each transport."""
    plan = c.placement_plan() if hasattr(c, "placement_plan") else None
    try:
        transports = planned_transports(c, plan) if plan is not None else {}
    except ValueError:
        return (f"weight sync:                   {c.weight_sync_transport} -> refused (see "
                "ERRORS)")
    sharded = c.num_learners >= 2 and bool(getattr(c, "fsdp", False))
    return f"weight sync:                   {c.weight_sync_transport} -> " + "; ".join(
        f"{t} for {who} ({describe(t, sharded)})" for t, who in who_takes(transports).items())


def _placement_lines(c: GRPOSettings) -> list[str]:
    """The layout and the run's placement plan, with the transport the run's planner picks
    for each env runner (a refused forced transport shows as the ERROR it raises)."""
    plan = c.placement_plan() if hasattr(c, "placement_plan") else None
    if plan is None:
        return []
    try:
        transports = planned_transports(c, plan)
    except ValueError:
        transports = None
    return layout_lines(c, plan, transports)


def _agg_effect(mode: str) -> str:
    return {
        "token-mean": "every token weighs the same: long responses get more total weight "
        "than short ones (verl's default, DAPO).",
        "token-sum": "tokens are summed: the loss scales with the batch's token count.",
        "seq-mean-token-sum": "each response's token sum, averaged over responses: long "
        "responses get proportionally larger gradients.",
        "seq-mean-token-mean": "each response weighs the same whatever its length: tokens of "
        "short responses weigh more (original GRPO).",
        "seq-mean-token-sum-norm": "token sums averaged over responses and divided by a fixed "
        "horizon: no length bias (Dr.GRPO).",
    }.get(mode, "unknown mode")


def _kl_line(c: GRPOSettings) -> str:
    if c.use_kl_loss and c.use_kl_in_reward:
        return (f"KL: BOTH in the loss ({c.kl_loss_type}, coef {c.kl_loss_coef}) and in the "
                f"reward ({c.kl_penalty}, {c.kl_ctrl_type} coef {c.kl_coef})")
    if c.use_kl_loss:
        return (f"KL: in the loss, {c.kl_loss_type} estimator, coefficient {c.kl_loss_coef}, "
                f"aggregated with {c.loss_agg_mode}")
    if c.use_kl_in_reward:
        return (f"KL: in the reward, {c.kl_penalty} estimator, {c.kl_ctrl_type} controller "
                f"(coef {c.kl_coef}), summed into the outcome before group normalisation")
    return "KL: none (no reference model is loaded)"


def _schedule_lines(c: GRPOSettings) -> list[str]:
    """Learning rate, mini-batch order, data order and validation, as verl words them."""
    from rllib_grpo.algos.lr_schedule import num_warmup_steps

    if isinstance(c.lr, list | tuple):
        lr = f"RLlib schedule {c.lr} (keyed by sampled trajectories)"
    else:
        try:
            warmup = f"{num_warmup_steps(c.lr_warmup_steps, c.lr_warmup_steps_ratio, c.total_training_steps)}"
        except ValueError:
            warmup = f"{c.lr_warmup_steps_ratio} x total_training_steps (unknown)"
        decay = (f", then cosine to {c.min_lr_ratio or 0} x lr at step {c.total_training_steps}"
                 if c.lr_scheduler_type == "cosine" else ", then constant")
        lr = f"{c.lr}, linear warm-up over {warmup} training steps{decay}"
    val = c.validation_sampling()
    how = ("greedy" if val.temperature == 0 else
           f"sampled at temperature {val.temperature}, top_p {val.top_p}, top_k {val.top_k}")
    every = (f"every {c.val_every} steps and at the last" if c.val_every > 0 else "never")
    seed = c.data_seed if c.data_seed is not None else (c.seed or 0)
    return [
        f"learning rate:                 {lr} (one scheduler step per training step, as verl)",
        "mini-batch order:              " + (
            f"a new permutation every epoch, the first included (seed "
            f"{c.minibatch_shuffle_seed} + learner rank)" if c.shuffle_batch_per_epoch
            else "as sampled"),
        "prompt order:                  " + (
            f"one permutation per epoch (seed {seed}) shared by all env runners"
            if c.data_shuffle else "the data's own order, shared by all env runners"),
        f"validation:                    {every}"
        + (", and once before training" if c.val_before_train else "")
        + f"; {c.val_num_prompts or 'every held-out'} prompts x {c.val_n}, {how}",
    ]


def _recipe_lines(c: GRPOSettings) -> list[str]:
    lines = []
    if c.filter_groups:
        limit = c.max_num_gen_batches if c.max_num_gen_batches > 0 else "unlimited"
        lines.append(f"dynamic sampling:              keep groups whose {c.filter_groups_metric} "
                     f"varies; {c.gen_prompts_per_batch or c.prompts_per_step} prompts per "
                     f"generation batch, at most {limit} batches per step")
    if c.overlong_buffer_len > 0 and c.overlong_buffer_enable is not False:
        lines.append(f"overlong shaping:              penalty from 0 at "
                     f"{c.max_response_length - c.overlong_buffer_len} to "
                     f"-{c.overlong_penalty_factor} at {c.max_response_length} tokens")
    return lines


def explain_config(c: GRPOSettings) -> str:
    """A human-readable plan of what one training step does, with errors and pitfalls."""
    plan = c.batch_plan()
    lines = [
        f"model: {c.model_path} ({c.compute_dtype})   sampler: {c.sampler}   "
        f"temperature {c.temperature}, top_p {c.top_p}, top_k {c.top_k}",
        f"prompts per step:              {plan.prompts_per_step}",
        f"trajectories per step:         {plan.trajectories_per_step} "
        f"(= {plan.prompts_per_step} prompts x group_size {c.group_size})",
        f"mini-batch:                    {plan.prompts_per_minibatch} prompts = "
        f"{plan.trajectories_per_minibatch} trajectories "
        f"({plan.trajectories_per_minibatch_per_learner} per learner on "
        f"{plan.num_learners} learner(s))",
        f"optimizer steps per step:      {plan.optimizer_steps_per_step} "
        f"(= {plan.minibatches_per_epoch} mini-batches x {c.num_epochs} epoch(s))",
    ]
    if c.micro_batches_by_tokens:
        lines.append(f"micro-batches:                 token budget {c.max_tokens_per_micro_batch} "
                     "tokens per micro-batch, same count on every learner")
    else:
        lines.append(f"micro-batches per mini-batch:  {plan.micro_batches_per_minibatch} of "
                     f"{plan.micro_batch_size_per_learner} trajectories per learner "
                     "(gradient accumulation)")
    lines.append(_memory_defaults_line(c))
    from rllib_grpo.rllib.config.staleness import old_log_probs_from_update

    lines.append("learner forwards:              " + (
        "packed rows, no padding (use_remove_padding)" + (
            ", one copy of each prompt per group where the attention takes a mask "
            "(share_prompt_prefix)" if c.share_prompt_prefix else "")
        if c.use_remove_padding else "padded rows with attention masks") + "; old log-probs " + (
        "from the update's own forward (one mini-batch, one epoch)"
        if old_log_probs_from_update(c) else "from a separate pass") + (
        f"; rollout_is={c.rollout_is!r}: loss x min(pi_old/pi_rollout per "
        f"{'response' if c.rollout_is == 'sequence' else 'token'}, {c.rollout_is_threshold})"
        if c.rollout_is else ""))
    lines += [
        f"sequence budget:               prompt <= {c.max_prompt_length} tokens "
        f"(truncation={c.truncation}), response <= {c.max_response_length} tokens",
        *prompt_length_lines(c),
        *vision_lines(c),
        *reward_plan_lines(c),
        *reward_fn_probe_lines(c),
        f"advantage:                     {c.adv_estimator}"
        + (" (Dr.GRPO: no std normalisation)" if not c.norm_adv_by_std_in_grpo else ""),
        f"policy loss:                   {c.policy_loss}, clip [{c.clip_ratio_low or c.clip_ratio}, "
        f"{c.clip_ratio_high or c.clip_ratio}], dual clip {c.clip_ratio_c}",
        f"loss aggregation:              {c.loss_agg_mode}: {_agg_effect(c.loss_agg_mode)}",
        _kl_line(c),
        _lora_line(c),
        _precision_line(c),
        *_schedule_lines(c),
        *_recipe_lines(c),
        *_placement_lines(c),
        async_line(c),
        _weight_sync_line(c),
    ]
    lines += memory_lines(c)
    errors, pitfalls = find_errors(c), find_pitfalls(c)
    for title, items in (("ERRORS", errors), ("PITFALLS", pitfalls)):
        if items:
            lines.append(f"{title}:")
            lines += [f"  - {item}" for item in items]
    if not errors and not pitfalls:
        lines.append("No pitfalls found.")
    return "\n".join(lines)
