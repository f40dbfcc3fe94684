"""`GRPOLearner`: the loss side of GRPO on an RLlib `TorchLearner`.

Per training step each learner holds whole groups and, as in verl:
1. recomputes the old log-probs (and entropy) at the sampling temperature, and
   the reference log-probs when a KL term is on;
2. turns scores into token-level rewards (minus the in-reward KL, if on) and
   advantages, with `rllib_grpo.algos`;
3. runs epochs x mini-batches (RLlib's iterator), and inside each mini-batch
   accumulates gradients over micro-batches whose losses are normalised by the
   mini-batch's *global* token and sequence counts (all-reduced once), so the
   update does not depend on how the batch was split; one optimizer step per
   mini-batch, skipped when the gradient norm is not finite.

Multi-turn batches carry a ``loss_mask`` (1 on the model's own tokens, 0 on the
environment's, `rllib_grpo.data.trajectory`): everything after the forward pass
(advantages, losses, token counts, entropy and rollout metrics) uses it instead
of ``response_mask``, which stays the attention mask.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import defaultdict
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.annotations import override

from rllib_grpo.algos import (
    agg_loss,
    compute_advantage,
    get_kl_controller,
    kl_penalty,
    policy_loss,
)
from rllib_grpo.data.batching import num_micro_batches_for_budget, split_fixed, split_token_budget
from rllib_grpo.models.offload import offload_optimizer_states
from rllib_grpo.rllib.distributed import all_reduce, world_size
from rllib_grpo.rllib.module import response_log_probs

logger = logging.getLogger(__name__)

# Columns the learner reads from the rollout batch (see rllib_grpo.data.rollout.RolloutBatch).
TENSOR_COLUMNS = (
    "prompt_ids", "prompt_mask", "response_ids", "response_mask", "rollout_log_probs",
    "scores", "group_index", "sample_mask", "reward_baselines", "truncated", "loss_mask",
)
# Per-token rates from the policy loss, averaged over micro-batches by token count.
RATE_METRICS = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
FORWARD_COLUMNS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")


def _select(batch: dict[str, torch.Tensor], rows: list[int] | torch.Tensor) -> dict:
    idx = torch.as_tensor(rows, dtype=torch.long)
    return {k: v.index_select(0, idx.to(v.device)) for k, v in batch.items()}


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    if values.numel() == 0:
        return {}
    values = values.float()
    return {f"{prefix}/mean": values.mean().item(), f"{prefix}/max": values.max().item(),
            f"{prefix}/min": values.min().item()}


@dataclasses.dataclass(frozen=True)
class MiniBatchTotals:
    """Global counts of one mini-batch (all learners) that normalise every micro-batch's loss,
    so the update does not depend on how the mini-batch was split (`rllib_grpo.algos.agg_loss`)."""

    dp_size: int
    global_num_tokens: float
    global_num_seqs: float
    horizon: float

    def agg_kwargs(self) -> dict[str, float]:
        return dataclasses.asdict(self)


class StepMetrics:
    """Values logged during one training step, averaged per key when flushed (every
    mini-batch and micro-batch of the step adds to the same mean)."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = defaultdict(list)

    def add(self, key: str, value: float) -> None:
        self.values[key].append(float(value))

    def flush(self, logger: Any, module_id: str) -> None:
        """Log each key's mean to RLlib's metrics logger, then start over."""
        for key, values in self.values.items():
            logger.log_value((module_id, key), float(np.mean(values)), reduce="mean", window=1)
        self.values.clear()


class GRPOLearner(TorchLearner):
    """Learner computing verl's GRPO loss with globally normalised aggregation."""

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self.step_metrics = StepMetrics()
        c = self.config
        self.kl_ctrl = get_kl_controller(
            c.kl_ctrl_type, kl_coef=c.kl_coef, target_kl=c.kl_target, horizon=c.kl_horizon
        )
        self.skipped_steps = 0

    # ------------------------------------------------------------------ optimizer
    @override(TorchLearner)
    def configure_optimizers_for_module(self, module_id: str, config: Any = None) -> None:
        config = config or self.config
        params = [p for p in self._module[module_id].parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(
            params, lr=1e-3, betas=tuple(config.betas), weight_decay=config.weight_decay
        )
        if config.optimizer_offload:  # AdamW states in host memory between steps
            offload_optimizer_states(optimizer)
        self.register_optimizer(
            module_id=module_id, optimizer=optimizer, params=params,
            lr_or_lr_schedule=self._lr_schedule(config),
        )

    @staticmethod
    def _lr_schedule(config: Any) -> Any:
        """Constant LR, or RLlib's piecewise schedule for a linear warm-up.

        RLlib schedules are keyed by sampled env steps (trajectories here).
        """
        if not config.lr_warmup_steps or isinstance(config.lr, list):
            return config.lr
        per_step = config.batch_plan().trajectories_per_step
        return [[0, 0.0], [config.lr_warmup_steps * per_step, config.lr]]

    # ------------------------------------------------------------------ update
    @override(TorchLearner)
    def update(self, batch=None, *, training_data: TrainingData | None = None,
               timesteps: dict | None = None, **kwargs: Any) -> Any:
        """Prepare advantages on this learner's whole groups, then run the mini-batches."""
        training_data = training_data or TrainingData(batch=batch)
        training_data.validate()
        training_data.solve_refs()
        module_batch = training_data.batch.policy_batches[DEFAULT_MODULE_ID]
        tensors = {
            k: torch.as_tensor(np.asarray(module_batch[k])).to(self._device)
            for k in TENSOR_COLUMNS if k in module_batch
        }
        prepared = self._prepare(tensors)
        plan = self.config.batch_plan()
        kwargs.update(
            num_epochs=self.config.num_epochs,
            minibatch_size=plan.trajectories_per_minibatch_per_learner,
            shuffle_batch_per_epoch=self.config.shuffle_batch_per_epoch,
        )
        mab = MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(prepared)}, env_steps=len(
            prepared["scores"]))
        super().update(training_data=TrainingData(batch=mab), timesteps=timesteps,
                       _no_metrics_reduce=True, **kwargs)
        self._log_step_metrics()
        return self.metrics.reduce()

    @torch.no_grad()
    def _prepare(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c, module = self.config, self.module[DEFAULT_MODULE_ID].unwrapped()
        mask = batch["response_mask"].float()
        old, entropy = torch.zeros_like(mask), torch.zeros_like(mask)
        ref = torch.zeros_like(mask) if c.needs_reference else None
        # The same micro-batches as the update (fixed size or token budget, same count on
        # every learner: sharded forwards are collective).  Rows come back in place.
        for rows in self._micro_batches(batch):
            micro = _select({k: batch[k] for k in FORWARD_COLUMNS}, rows or [0])
            out = response_log_probs(module.lm, micro, c.temperature, with_entropy=True)
            ref_out = module.reference_log_probs(micro) if ref is not None else None
            if not rows:  # an empty token-budget bin: the pass only keeps ranks in step
                continue
            index = torch.as_tensor(rows, device=mask.device)
            old[index], entropy[index] = out["log_probs"], out["entropy"]
            if ref is not None:
                ref[index] = ref_out
        batch["old_log_probs"] = old
        if ref is not None:
            batch["ref_log_probs"] = ref
        # Multi-turn: only the model's tokens count from here on (env tokens: loss_mask 0).
        mask = batch["loss_mask"].float() if "loss_mask" in batch else mask
        self._log_rollout_agreement(batch, mask)
        self._log("actor/entropy", agg_loss(entropy, mask, c.loss_agg_mode,
                                            horizon=c.loss_horizon).item())

        token_scores = self._scores_to_tokens(batch["scores"].float(), mask)
        token_rewards = token_scores
        if c.use_kl_in_reward:
            token_rewards = self._apply_kl_in_reward(batch, token_scores, mask)
        advantages, returns = compute_advantage(
            c.adv_estimator, token_rewards, mask,
            group_ids=batch["group_index"].cpu().numpy(),
            norm_adv_by_std_in_grpo=c.norm_adv_by_std_in_grpo, gamma=c.gamma,
            reward_baselines=batch["reward_baselines"] if c.adv_estimator == "remax" else None,
        )
        batch["advantages"] = advantages * batch["sample_mask"][:, None]
        if c.mask_truncated_completions:
            # DAPO "overlong filtering": cut responses stay in their group's statistics
            # but contribute no loss.
            keep = (~batch["truncated"].bool()).float()
            batch["loss_mask"] = mask * keep[:, None]
            self._log("response/truncated_masked_frac", 1.0 - keep.mean().item())
        if c.rollout_is == "token":
            batch["rollout_is_weights"] = self._rollout_is_weights(batch, mask)
        valid = mask.bool() & batch["sample_mask"][:, None].bool()
        real = batch["sample_mask"].bool()
        for name, values in (("critic/rewards", token_rewards.sum(-1)[real]),
                             ("critic/advantages", advantages[valid]),
                             ("critic/returns", returns[valid])):
            for key, value in _stats(name, values).items():
                self._log(key, value)
        return {k: v for k, v in batch.items()}

    def _rollout_is_weights(self, batch, mask) -> torch.Tensor:
        """Truncated token-level importance weights pi_old / pi_rollout (verl rollout_is=token)."""
        log_ratio = (batch["old_log_probs"] - batch["rollout_log_probs"].float()).clamp(-20, 20)
        weights = log_ratio.exp().clamp(max=self.config.rollout_is_threshold) * mask
        valid = mask.bool()
        if valid.any():
            self._log("rollout_corr/is_weight_mean", weights[valid].mean().item())
            self._log("rollout_corr/is_truncated_frac", (log_ratio.exp()[valid] >
                                                         self.config.rollout_is_threshold)
                      .float().mean().item())
        return weights

    @staticmethod
    def _scores_to_tokens(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Scalar score on the last valid response token (index 0 for empty responses).

        The last position where ``mask`` is 1, so a multi-turn loss mask (with holes where the
        environment's tokens are) puts the score on the model's last token.
        """
        token_scores = torch.zeros_like(mask)
        positions = torch.arange(mask.shape[-1], device=mask.device)
        last = torch.where(mask > 0, positions, -1).max(-1).values.clamp(min=0)
        token_scores[torch.arange(len(scores)), last] = scores
        return token_scores

    def _apply_kl_in_reward(self, batch, token_scores, mask) -> torch.Tensor:
        c = self.config
        kld = kl_penalty(batch["old_log_probs"], batch["ref_log_probs"], c.kl_penalty) * mask
        beta = self.kl_ctrl.value
        per_seq = (kld * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        # The controller must see the KL of the whole step, so sum over learners.
        totals = all_reduce(torch.stack([per_seq.sum(), per_seq.new_tensor(float(len(per_seq)))]))
        current_kl = (totals[0] / totals[1].clamp(min=1)).item()
        self.kl_ctrl.update(current_kl, n_steps=int(totals[1].item()))
        self._log("actor/reward_kl_penalty", current_kl)
        self._log("actor/reward_kl_penalty_coeff", beta)
        return token_scores - beta * kld

    def _log_rollout_agreement(self, batch, mask) -> None:
        """verl's rollout-vs-trainer probability gap (DESIGN: always logged)."""
        if "rollout_log_probs" not in batch:
            return
        valid = mask.bool() & batch["sample_mask"][:, None].bool()
        rollout_p = batch["rollout_log_probs"].float()[valid].exp()
        trainer_p = batch["old_log_probs"][valid].exp()
        if rollout_p.numel() == 0:
            return
        diff = (rollout_p - trainer_p).abs()
        self._log("training/rollout_probs_diff_mean", diff.mean().item())
        self._log("training/rollout_probs_diff_max", diff.max().item())
        log_diff = (batch["rollout_log_probs"].float() - batch["old_log_probs"])[valid].abs()
        self._log("training/rollout_log_probs_diff_max", log_diff.max().item())
        if rollout_p.numel() > 1 and rollout_p.std() > 0 and trainer_p.std() > 0:
            corr = torch.corrcoef(torch.stack([rollout_p, trainer_p]))[0, 1]
            self._log("training/rollout_actor_probs_pearson_corr", corr.item())

    # ------------------------------------------------------------------ one mini-batch
    def _micro_batches(self, minibatch: dict[str, torch.Tensor]) -> list[list[int]]:
        c, n = self.config, len(minibatch["scores"])
        if not c.use_dynamic_bsz:
            return split_fixed(n, self.config.batch_plan().micro_batch_size_per_learner or n)
        lengths = (minibatch["prompt_mask"].sum(-1) + minibatch["response_mask"].sum(-1))
        num = num_micro_batches_for_budget(lengths.tolist(), c.max_tokens_per_micro_batch)
        # Every learner must run the same number of forward/backward passes.
        # On the learner's device: NCCL (GPU learners) reduces no CPU tensors.
        num = int(all_reduce(torch.tensor(num, device=self._device), dist.ReduceOp.MAX).item())
        return split_token_budget(lengths.tolist(), num)

    def _minibatch_totals(self, minibatch: dict[str, torch.Tensor]) -> MiniBatchTotals:
        """The mini-batch's global token and sequence counts (all-reduced: collective)."""
        mask = minibatch.get("loss_mask", minibatch["response_mask"]).float()
        counts = all_reduce(torch.stack([mask.sum(), minibatch["sample_mask"].float().sum()]))
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
        for rows in self._micro_batches(minibatch):
            micro = _select(minibatch, rows) if rows else _select(minibatch, [0])
            if not rows:  # an empty token-budget bin: a zero-weight pass keeps ranks in step
                micro["response_mask"] = torch.zeros_like(micro["response_mask"])
                if "loss_mask" in micro:
                    micro["loss_mask"] = torch.zeros_like(micro["loss_mask"])
            fwd = module.forward_train(
                {k: micro[k] for k in FORWARD_COLUMNS}, with_entropy=self.config.entropy_coeff != 0
            )
            loss, metrics = self._micro_batch_loss(micro, fwd, totals)
            loss.backward()
            total = total + loss.detach()
            for key, value in metrics.items():
                sums[key] += value
        self._apply_step(sums, total)
        return {}, {DEFAULT_MODULE_ID: total}, {}

    @override(TorchLearner)
    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out) -> torch.Tensor:
        """RLlib's hook: the loss of ``batch`` taken as a whole mini-batch."""
        return self._micro_batch_loss(batch, fwd_out, self._minibatch_totals(batch))[0]

    def _micro_batch_loss(self, batch: dict[str, torch.Tensor], fwd_out: dict[str, torch.Tensor],
                          totals: MiniBatchTotals) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of the mini-batch loss (normalised by ``totals``), and its
        metrics as partial sums (per-token rates weighted by the micro-batch's tokens)."""
        c, agg = self.config, totals.agg_kwargs()
        mask = batch.get("loss_mask", batch["response_mask"]).float()
        log_prob = fwd_out["log_probs"]
        pg_loss, pg_metrics = policy_loss(
            c.policy_loss, old_log_prob=batch["old_log_probs"], log_prob=log_prob,
            advantages=batch["advantages"], response_mask=mask,
            loss_agg_mode=c.loss_agg_mode, clip_ratio=c.clip_ratio,
            clip_ratio_low=c.clip_ratio_low, clip_ratio_high=c.clip_ratio_high,
            clip_ratio_c=c.clip_ratio_c, rollout_is_weights=batch.get("rollout_is_weights"), **agg,
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
        if self.config.use_kl_loss:
            self._log("actor/kl_coef", self.config.kl_loss_coef)

    def _clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        """Clip to ``max_norm`` in place; the norm before clipping (sharded learners override)."""
        return torch.nn.utils.clip_grad_norm_(params, max_norm).item()

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
        if components is None or "kl_ctrl" in (
                [components] if isinstance(components, str) else components):
            state["kl_ctrl"] = self.kl_ctrl.state_dict()
        return state

    @override(TorchLearner)
    def set_state(self, state: dict) -> None:
        super().set_state(state)
        if "kl_ctrl" in state:
            self.kl_ctrl.load_state_dict(state["kl_ctrl"])
