"""`GRPOLearner`: the loss side of GRPO on an RLlib `TorchLearner`.

Per training step each learner holds whole groups and, as in verl:
1. recomputes the old log-probs (and entropy) at the sampling temperature, and
   the reference log-probs when a KL term is on, on the update's own micro-batches
   (`rllib_grpo.rllib.learner.micro_batches`; packed rows without padding by default); on an
   on-policy step the update's forward gives the old log-probs instead;
2. turns scores into token-level rewards (minus the in-reward KL, if on) and
   advantages, with `rllib_grpo.algos`;
3. runs epochs x mini-batches (RLlib's iterator), and inside each mini-batch
   accumulates gradients over micro-batches whose losses are normalised by the
   mini-batch's *global* token and sequence counts (all-reduced once), so the
   update does not depend on how the batch was split; one optimizer step per
   mini-batch, skipped when the gradient norm is not finite.  (Hence
   ``_uncompiled_update`` is overridden: RLlib's ``compute_loss_for_module`` takes one
   loss of one forward over the mini-batch, and is not used.)

Multi-turn batches carry a ``loss_mask`` (1 on the model's own tokens, 0 on the
environment's, `rllib_grpo.data.trajectory`): everything after the forward pass
(advantages, losses, token counts, entropy and rollout metrics) uses it instead
of ``response_mask``, which stays the attention mask.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections import defaultdict
from collections.abc import Iterator
from functools import cached_property
from typing import Any

import numpy as np
import torch
from ray.rllib.core import COMPONENT_RL_MODULE, DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch import torch_learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_grpo.algos import agg_loss, get_kl_controller, kl_penalty, policy_loss
from rllib_grpo.models.offload import offload_optimizer_states
from rllib_grpo.models.packing import prefer_varlen_attention
from rllib_grpo.models.vision_forward import VISION_COLUMN
from rllib_grpo.rllib.choreography import free_device_memory
from rllib_grpo.rllib.cpu_tuning import tune_cpu_learner
from rllib_grpo.rllib.learner.advantage_step import step_advantages
from rllib_grpo.rllib.learner.distributed import (
    all_reduce,
    gradient_sync,
    load_optimizer_states,
    optimizer_states,
    rank,
    world_size,
)
from rllib_grpo.rllib.learner.forward_passes import forward_columns, old_and_reference_log_probs
from rllib_grpo.rllib.learner.micro_batches import MiniBatchTotals, micro_batches, sequence_lengths
from rllib_grpo.rllib.learner.micro_batches import select_rows as _select
from rllib_grpo.rllib.learner.perf import (
    PhaseTimes,
    StepMetrics,
    critic_metrics,
    num_parameters,
    peak_flops,
    step_metrics,
)
from rllib_grpo.rllib.learner.rollout_gap import rollout_correction
from rllib_grpo.rllib.learner.step_schedule import LRSchedule, minibatch_order
from rllib_grpo.rllib.learner.weight_sender import WeightSender
from rllib_grpo.rllib.placement import fake_gpus, hide_unassigned_gpus
from rllib_grpo.rllib.stacks import enable_stack_dumps_for

logger = logging.getLogger(__name__)

# Columns the learner reads from the rollout batch (see rllib_grpo.data.rollout.RolloutBatch).
TENSOR_COLUMNS = (
    "prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_log_probs",
    "scores", "group_index", "reward_baselines", "truncated", "loss_mask",
    "weights_version",
)
# Per-token rates from the policy loss, averaged over micro-batches by token count.
RATE_METRICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")


def adamw_implementation(params: list[torch.Tensor]) -> dict[str, bool]:
    """``fused=True`` where torch has a fused AdamW kernel for every parameter (floating
    point, on CPU or CUDA), else torch's default.  On CPU torch's default is the for-loop,
    several times slower than the fused kernel for an AdamW step."""
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda")
                                 for p in params)
    return {"fused": True} if fused else {}


@contextlib.contextmanager
def _cpu_where_gpus_are_fake() -> Iterator[None]:
    """While RLlib's `TorchLearner.build` picks the learner's device (``get_device``, by
    that module name): the CPU where Ray's GPUs are declared only (`fake_gpus`)."""
    if not fake_gpus():
        yield
        return
    original = torch_learner.get_device
    torch_learner.get_device = lambda *_: torch.device("cpu")
    try:
        yield
    finally:
        torch_learner.get_device = original


class GRPOLearner(TorchLearner):
    """Learner computing verl's GRPO loss with globally normalised aggregation."""

    @override(TorchLearner)
    def build(self) -> None:
        hide_unassigned_gpus()
        # The run's deadlines can show this process's stack (rllib_grpo.rllib.stacks).
        name = next(c.__name__ for c in type(self).__mro__ if not c.__name__.startswith("_"))
        enable_stack_dumps_for(self.config, f"learner {rank()} ({name})"
                               if self.config.num_learners else f"the local learner ({name})")
        with _cpu_where_gpus_are_fake():
            super().build()
        self.step_metrics = StepMetrics()
        c = self.config
        self.kl_ctrl = get_kl_controller(
            c.kl_ctrl_type, kl_coef=c.kl_coef, target_kl=c.kl_target, horizon=c.kl_horizon
        )
        self.skipped_steps = 0
        self.lr_schedule = LRSchedule.from_config(c)  # None: RLlib applies a list schedule
        self.phase_times = PhaseTimes(self._device)
        models = [lm for rl_module in self.module.values()
                  for lm in (rl_module.unwrapped().lm, getattr(rl_module.unwrapped(), "ref_lm", None))
                  if lm is not None]
        tune_cpu_learner(c, self._device, models)
        if c.use_remove_padding:  # GPU: flash-attention's varlen kernel if present
            for lm in models:
                prefer_varlen_attention(lm, self._device, c.compute_dtype)

    @cached_property
    def weight_sender(self) -> WeightSender:
        """This learner's half of weight syncs (made on first use: a sync's first call)."""
        return WeightSender(self)

    # ------------------------------------------------------------------ optimizer
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        config = config or self.config
        params = [p for p in self._module[module_id].parameters() if p.requires_grad]
        rllib_schedule = isinstance(config.lr, list | tuple)
        optimizer = torch.optim.AdamW(
            params, lr=1e-3 if rllib_schedule else config.lr, betas=tuple(config.betas),
            weight_decay=config.weight_decay, **adamw_implementation(params),
        )
        if config.optimizer_offload:  # AdamW states in host memory between steps
            offload_optimizer_states(optimizer)
        # A float lr follows verl's schedule (`LRSchedule`, set per training step in
        # `update`); RLlib's own piecewise list schedule is keyed by sampled env steps.
        self.register_optimizer(
            module_id=module_id, optimizer=optimizer, params=params,
            lr_or_lr_schedule=config.lr if rllib_schedule else None,
        )

    # ------------------------------------------------------------------ update
    @override(TorchLearner)
    def update(self, batch=None, *, training_data: TrainingData | None = None,
               timesteps: dict | None = None, **kwargs: Any) -> Any:
        """Prepare advantages on this learner's whole groups, then run the mini-batches."""
        training_data = training_data or TrainingData(batch=batch)
        training_data.validate()
        training_data.solve_refs()
        module_batch = training_data.batch.policy_batches[DEFAULT_MODULE_ID]
        tensors: dict[str, Any] = {
            k: torch.as_tensor(np.asarray(module_batch[k])).to(self._device)
            for k in TENSOR_COLUMNS if k in module_batch
        }
        if VISION_COLUMN in module_batch:  # per row: its prompt's images (numpy objects)
            tensors[VISION_COLUMN] = np.asarray(module_batch[VISION_COLUMN], dtype=object)
        if "weights_version" in tensors:  # learner updates since each trajectory's weights
            tensors["staleness"] = self._weights_seq_no - tensors.pop("weights_version")
        self.phase_times.reset()
        c, minibatch = self.config, self.config.batch_plan().trajectories_per_minibatch_per_learner
        order, epochs = minibatch_order(len(tensors["scores"]), minibatch, c.num_epochs,
                                        c.shuffle_batch_per_epoch, c.minibatch_shuffle_seed + rank())
        if order is not None:  # verl's actor.shuffle (see minibatch_order); before the old-
            # log-prob pass, whose micro-batches must be the update's (groups travel along)
            tensors = _select(tensors, order)
        prepared = self._prepare(tensors)
        kwargs.update(num_epochs=epochs, minibatch_size=minibatch, shuffle_batch_per_epoch=False)
        mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(prepared)}, env_steps=len(
            prepared["scores"]))
        if self.lr_schedule is not None:
            self._log("actor/lr", self.lr_schedule.apply(self._optimizer_parameters))
        super().update(training_data=TrainingData(batch=mab), timesteps=timesteps,
                       _no_metrics_reduce=True, **kwargs)
        if self.lr_schedule is not None:
            self.lr_schedule.step()
        lm = self.module[DEFAULT_MODULE_ID].unwrapped().lm
        for key, value in step_metrics(self.phase_times, num_parameters(lm),
                                       peak_flops(self._device)).items():
            self._log(key, value)
        self._log_step_metrics()
        return self.metrics.reduce()

    @torch.no_grad()
    def _prepare(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Add what the update reads to ``batch`` (this learner's rows, in update order):
        ``old_log_probs`` (unless the update's forward gives them), ``ref_log_probs`` (with a
        KL term), ``advantages``, the truncation-masked ``loss_mask`` and, with rollout_is,
        ``rollout_is_weights``; log the step's critic/*, rollout-gap and entropy metrics."""
        passes = self._old_and_reference_log_probs(batch)
        entropy = passes.pop("entropy", None)
        batch.update(passes)
        # Multi-turn: only the model's tokens count from here on (env tokens: loss_mask 0).
        mask = batch.get("loss_mask", batch["response_mask"]).float()
        step = step_advantages(batch, mask, self.config, self.kl_ctrl)
        for key, value in step.metrics.items():
            self._log(key, value)
        batch["advantages"] = step.advantages
        if step.loss_mask is not None:
            batch["loss_mask"] = step.loss_mask
        if entropy is not None:  # (else from the update's forward, micro-batch by micro-batch)
            weights = self._log_old_log_prob_metrics(batch, entropy)
            if weights is not None:  # rollout_is on
                batch["rollout_is_weights"] = weights
        metrics = critic_metrics(step.token_rewards, step.advantages, step.returns, mask)
        for key, value in metrics.items():
            self._log(key, value)
        return dict(batch)

    def _old_and_reference_log_probs(self, batch: dict[str, torch.Tensor]
                                     ) -> dict[str, torch.Tensor]:
        """`rllib_grpo.rllib.learner.forward_passes.old_and_reference_log_probs` here."""
        return old_and_reference_log_probs(self.module[DEFAULT_MODULE_ID].unwrapped(), batch,
                                           self.config, self._device, self.phase_times)

    def _log_old_log_prob_metrics(self, batch: dict[str, torch.Tensor],
                                  entropy: torch.Tensor) -> torch.Tensor | None:
        """Log what the old log-probs show (the rollout gap, the rollout_is weights', the
        entropy) over the loss mask; return those weights (None: rollout_is off)."""
        mask = batch.get("loss_mask", batch["response_mask"]).float()
        # verl's rollout-vs-trainer gap (DESIGN: always logged), the rollout_is weights'.
        weights, metrics = rollout_correction(batch, mask, self.config)
        for key, value in metrics.items():
            self._log(key, value)
        # verl aggregates the entropy over the whole batch: global counts, summed over learners.
        totals = self._minibatch_totals(batch)
        entropy_share = agg_loss(entropy, mask, self.config.loss_agg_mode, **totals.agg_kwargs())
        self._log("actor/entropy", all_reduce(entropy_share).item() / totals.dp_size)
        return weights

    # ------------------------------------------------------------------ one mini-batch
    def _micro_batches(self, minibatch: dict[str, torch.Tensor]) -> list[list[int]]:
        """Row indices of each micro-batch (`rllib_grpo.rllib.learner.micro_batches`; collective)."""
        return micro_batches(minibatch, self.config, self._device)

    def _minibatch_totals(self, minibatch: dict[str, torch.Tensor]) -> MiniBatchTotals:
        """The mini-batch's global token and sequence counts (all-reduced: collective)."""
        mask = minibatch.get("loss_mask", minibatch["response_mask"]).float()
        # Every row is a trajectory (no padding rows: learners get whole groups, equal
        # shares); an empty response counts as a sequence too, as in verl.
        counts = all_reduce(torch.stack([mask.sum(), mask.new_tensor(float(len(mask)))]))
        return MiniBatchTotals(dp_size=world_size(), global_num_tokens=counts[0].item(),
                               global_num_seqs=counts[1].item(),
                               horizon=self.config.loss_horizon)

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any):
        """One mini-batch: micro-batches accumulate gradients, then one optimizer step."""
        minibatch = batch[DEFAULT_MODULE_ID]
        totals = self._minibatch_totals(minibatch)
        module = self.module[DEFAULT_MODULE_ID]
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self._device)
        sums: dict[str, float] = defaultdict(float)
        # The on-policy shortcut: old log-probs (and the entropy metric) from this forward.
        seen = None if "old_log_probs" in minibatch else {
            k: torch.zeros_like(minibatch["response_mask"], dtype=torch.float32)
            for k in ("old_log_probs", "entropy")}
        with self.phase_times.phase("update_policy", float(sequence_lengths(minibatch).sum())):
            micro_rows = self._micro_batches(minibatch)
            for i, rows in enumerate(micro_rows):
                micro = _select(minibatch, rows) if rows else _select(minibatch, [0])
                if not rows:  # an empty token-budget bin: a zero-weight pass keeps ranks in step
                    micro["response_mask"] = torch.zeros_like(micro["response_mask"])
                    if "loss_mask" in micro:
                        micro["loss_mask"] = torch.zeros_like(micro["loss_mask"])
                with gradient_sync(module, sync=i == len(micro_rows) - 1):  # DDP: no_sync
                    fwd = module.forward_train(
                        forward_columns(micro),
                        with_entropy=self.config.entropy_coeff != 0 or seen is not None,
                        detach_entropy=self.config.entropy_coeff == 0,
                        packed=self.config.use_remove_padding)
                    loss, metrics = self._micro_batch_loss(micro, fwd, totals)
                    loss.backward()
                total = total + loss.detach()
                for key, value in metrics.items():
                    sums[key] += value
                if seen is not None and rows:
                    index = torch.as_tensor(rows, device=self._device)
                    for key, name in (("old_log_probs", "log_probs"), ("entropy", "entropy")):
                        seen[key][index] = fwd[name].detach()
            self._apply_step(sums, total)
        if seen is not None:
            self._log_old_log_prob_metrics({**minibatch, **seen}, seen["entropy"])
        return {}, {DEFAULT_MODULE_ID: total}, {}

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        """Not used: RLlib declares it abstract, so it must exist, but nothing calls it.

        RLlib's path (``_uncompiled_update`` -> ``compute_losses`` -> this hook) does one
        forward over the whole mini-batch and takes one loss of it.  GRPO splits the
        mini-batch into micro-batches (memory) whose losses are normalised by the
        mini-batch's *global* token and sequence counts (all-reduced once over learners),
        so ``_uncompiled_update`` is overridden and calls `_micro_batch_loss` itself.
        """
        raise NotImplementedError(
            "GRPOLearner computes its loss per micro-batch in _uncompiled_update "
            "(_micro_batch_loss, normalised by the mini-batch's global counts); RLlib's "
            "compute_losses/compute_loss_for_module path is not used.")

    def _micro_batch_loss(self, batch: dict[str, torch.Tensor], fwd_out: dict[str, torch.Tensor],
                          totals: MiniBatchTotals) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of the mini-batch loss (normalised by ``totals``), and its
        metrics as partial sums (per-token rates weighted by the micro-batch's tokens)."""
        c, agg = self.config, totals.agg_kwargs()
        mask = batch.get("loss_mask", batch["response_mask"]).float()
        log_prob = fwd_out["log_probs"]
        # On-policy shortcut (no old-log-prob pass): the same forward, detached.
        old_log_prob = batch["old_log_probs"] if "old_log_probs" in batch else log_prob.detach()
        is_weights = batch.get("rollout_is_weights")
        if is_weights is None and c.rollout_is:  # shortcut: per row, so per micro-batch
            is_weights = rollout_correction({**batch, "old_log_probs": old_log_prob}, mask, c,
                                            metrics=False)[0]
        pg_loss, pg_metrics = policy_loss(
            c.policy_loss, old_log_prob=old_log_prob, log_prob=log_prob,
            advantages=batch["advantages"], response_mask=mask,
            loss_agg_mode=c.loss_agg_mode, clip_ratio=c.clip_ratio,
            clip_ratio_low=c.clip_ratio_low, clip_ratio_high=c.clip_ratio_high,
            clip_ratio_c=c.clip_ratio_c, rollout_is_weights=is_weights, **agg,
        )
        loss = pg_loss
        n_tok = mask.sum().item()
        # Sums are partial global means; per-token rates are weighted by token count.
        metrics = {"actor/pg_loss": pg_loss.item(), "tokens": n_tok}
        for key in RATE_METRICS:
            if key in pg_metrics:
                metrics[key] = float(pg_metrics[key]) * n_tok
        if c.entropy_coeff:
            entropy = agg_loss(fwd_out["entropy"], mask, c.loss_agg_mode, **agg)
            loss = loss - c.entropy_coeff * entropy
            metrics["actor/entropy_loss"] = entropy.item()
        if c.use_kl_loss:
            kld = kl_penalty(log_prob, batch["ref_log_probs"], c.kl_loss_type)
            kl_loss = agg_loss(kld, mask, c.loss_agg_mode, **agg)
            loss = loss + c.kl_loss_coef * kl_loss
            metrics["actor/kl_loss"] = kl_loss.item()
        return loss, metrics

    def _apply_step(self, sums: dict[str, float], total: torch.Tensor) -> None:
        params = [p for group in self._optimizer_parameters for p in group.param_groups[0]["params"]]
        clip = self.config.grad_clip or math.inf
        grad_norm = self._clip_grad_norm(params, clip)
        if math.isfinite(grad_norm):
            for optim in self._optimizer_parameters:
                optim.step()
        else:  # verl: a non-finite norm skips the step instead of corrupting Adam's moments
            self.skipped_steps += 1
            logger.warning("Non-finite grad norm (%s); optimizer step skipped.", grad_norm)
            for optim in self._optimizer_parameters:
                optim.zero_grad(set_to_none=True)
        tokens = max(sums.pop("tokens", 0.0), 1.0)
        for key, value in sums.items():
            self._log(key, value / tokens if key in RATE_METRICS else value)
        self._log("actor/loss", total.item())
        self._log("actor/grad_norm", grad_norm)
        self._log("actor/skipped_steps", float(self.skipped_steps))
        self._log("actor/skipped_frac", 0.0 if math.isfinite(grad_norm) else 1.0)  # this step
        if self.config.use_kl_loss:
            self._log("actor/kl_coef", self.config.kl_loss_coef)

    def _clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Clip to ``max_norm`` in place; the norm before clipping (sharded learners override)."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm).item()

    def release_memory(self) -> None:
        """Before an engine that shares this learner's GPU wakes (`rllib_grpo.rllib.
        choreography`): drop the gradients (the next mini-batch sets them anew) and return
        the cached GPU memory to the driver."""
        for optim in self._optimizer_parameters:
            optim.zero_grad(set_to_none=True)
        free_device_memory()

    # ------------------------------------------------------------------ metrics, state
    def _log(self, key: str, value: float) -> None:
        self.step_metrics.add(key, value)

    def _log_step_metrics(self) -> None:
        self.step_metrics.flush(self.metrics, DEFAULT_MODULE_ID)
        if self.config.use_kl_in_reward:
            self.metrics.log_value((DEFAULT_MODULE_ID, "kl_ctrl_value"), self.kl_ctrl.value,
                                   reduce="mean", window=1)

    @override(TorchLearner)
    def get_state(self, components=None, *, not_components=None, **kwargs):
        state = super().get_state(components, not_components=not_components, **kwargs)
        wanted = [components] if isinstance(components, str) else components
        if components is None or "kl_ctrl" in wanted:
            state["kl_ctrl"] = self.kl_ctrl.state_dict()
        if self.lr_schedule is not None and (components is None or "lr_schedule" in wanted):
            state["lr_schedule"] = self.lr_schedule.state_dict()
        return state

    # Optimizer state as torch tensors in their own dtype: RLlib's numpy round trip has no
    # bfloat16 (save crashes) and reads every float back as float32.
    @override(TorchLearner)
    def _get_optimizer_state(self) -> dict:
        return optimizer_states(self)

    @override(TorchLearner)
    def _set_optimizer_state(self, state: dict) -> None:
        load_optimizer_states(self, state)

    @override(TorchLearner)
    def set_state(self, state: dict) -> None:
        """RLlib's, except that module weights are loaded whatever their version: RLlib's
        Learner skips weights no newer than its own, so restoring an earlier state
        (``Algorithm.set_state``) would keep the newer weights beside the restored
        optimizer state."""
        if COMPONENT_RL_MODULE in state:
            self._weights_seq_no = 0  # RLlib's Learner loads the module at version 0
        super().set_state(state)
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
        if "lr_schedule" in state and self.lr_schedule is not None:
            self.lr_schedule.load_state_dict(state["lr_schedule"])
