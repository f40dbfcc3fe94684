"""The baseline: the same GRPO compute written as a plain loop in one process.

No Ray, no RLlib, no env runner, no driver: the project's sampler generates
prompts x group_size responses, `rllib_grpo.rllib.learner.module.response_log_probs` gives the
old (and reference) log-probs without gradients, and a forward + backward over
the same micro-batches plus one clipped AdamW step updates the policy, with the
same loss functions (`rllib_grpo.algos`).  With the transformers sampler the
policy itself generates (one copy of the weights, nothing to sync); vLLM gets
the new weights through `Sampler.load_weights`, as a one-process trainer would.
Prompts are drawn from the same environment before timing starts; scores are
seeded coin flips (scoring is the environment's work, not the model's).
"""

from __future__ import annotations

from typing import Any

import torch

from benchmarks.common import (
    Timer,
    Workload,
    cpu_per_iteration,
    cpu_seconds,
    maybe_profiled,
    peak_memory_mb,
    token_counts,
)
from rllib_grpo.algos import agg_loss, compute_advantage, kl_penalty, policy_loss
from rllib_grpo.data.batching import split_fixed
from rllib_grpo.models import load_causal_lm, load_tokenizer
from rllib_grpo.rllib.learner.module import response_log_probs
from rllib_grpo.samplers import SamplingParams, make_sampler

FORWARD_KEYS = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
KL_LOSS_COEF, KL_LOSS_TYPE = 0.001, "low_var_kl"  # GRPOConfig's defaults


def draw_prompts(w: Workload, tokenizer: Any, count: int) -> list[list[int]]:
    """``count`` prompts' token ids from the environment the RLlib run uses, in its order."""
    import gymnasium as gym

    import rllib_grpo  # noqa: F401  (registers the environments)

    env = gym.make(
        "rllib_grpo/Arithmetic-v0", disable_env_checker=True, tokenizer=tokenizer,
        max_prompt_length=w.max_prompt_length, truncation="error",
        filter_overlong_prompts=False, seed=w.seed, max_operand=w.max_operand,
    ).unwrapped
    return [list(env.reset()[1]["prompt_token_ids"]) for _ in range(count)]


def padded_batch(prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                 device: torch.device) -> dict[str, torch.Tensor]:
    """Prompts left-padded and responses right-padded to the batch's widest, with masks."""
    def pad(rows: list[list[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(max((len(r) for r in rows), default=1), 1)
        ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.float32)
        for i, row in enumerate(rows):
            if row:
                cols = slice(width - len(row), width) if left else slice(0, len(row))
                ids[i, cols] = torch.tensor(row)
                mask[i, cols] = 1.0
        return ids.to(device), mask.to(device)

    prompt_ids, prompt_mask = pad(prompts, left=True)
    response_ids, response_mask = pad(responses, left=False)
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask.long(),
            "response_ids": response_ids, "response_mask": response_mask}


class DirectGRPO:
    """Policy, optional reference, sampler and optimizer for the plain loop."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.device = torch.device(w.device)
        self.tokenizer = load_tokenizer(w.model_dir)
        self.policy = load_causal_lm(w.model_dir, dtype=w.dtype).to(self.device)
        self.ref = load_causal_lm(w.model_dir, dtype=w.dtype).to(self.device) if w.kl else None
        if self.ref is not None:
            self.ref.requires_grad_(False)
        self.sampler = make_sampler(w.sampler, model_path=w.model_dir, dtype=w.dtype,
                                    seed=w.seed, **w.engine_options())
        self.shared_weights = hasattr(self.sampler, "model")
        if self.shared_weights:  # transformers: generate with the policy itself
            self.policy.generation_config = self.sampler.model.generation_config
            self.sampler.model = self.policy
        self.optimizer = torch.optim.AdamW(self.policy.parameters(), lr=w.lr,
                                           betas=(0.9, 0.999), weight_decay=0.01)
        self.params = SamplingParams(temperature=1.0, max_tokens=w.response_length)
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.coins = torch.Generator().manual_seed(w.seed)

    def micro_batches(self, batch: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
        rows = len(batch["response_mask"])
        size = self.w.micro_batch_size or rows
        return [{k: v[r[0]: r[-1] + 1] for k, v in batch.items()}
                for r in split_fixed(rows, size)]

    def iteration(self, prompts: list[list[int]], timer: Timer) -> dict[str, float]:
        """One GRPO step; phase times go to ``timer``; returns the token counts."""
        w = self.w
        with timer.phase("generation"):
            groups = self.sampler.generate(prompts, w.group_size, self.params)
        with timer.phase("batching"):
            rows = [p for p in prompts for _ in range(w.group_size)]
            responses = [list(s.token_ids) for group in groups for s in group]
            batch = padded_batch(rows, responses, self.pad_id, self.device)
            scores = torch.randint(0, 2, (len(rows),), generator=self.coins).float()
        micros = self.micro_batches(batch)
        with timer.phase("old_log_prob"), torch.no_grad():
            batch["old_log_probs"] = torch.cat([response_log_probs(
                self.policy, {k: m[k] for k in FORWARD_KEYS}, 1.0, with_entropy=True,
            )["log_probs"] for m in micros])
        if self.ref is not None:
            with timer.phase("ref"), torch.no_grad():
                batch["ref_log_probs"] = torch.cat([response_log_probs(
                    self.ref, {k: m[k] for k in FORWARD_KEYS}, 1.0)["log_probs"] for m in micros])
        with timer.phase("adv"):
            batch["advantages"] = self.advantages(batch, scores.to(self.device), w.group_size)
        with timer.phase("update"):
            self.update(batch)
        if not self.shared_weights:
            with timer.phase("weight_sync"):
                self.sampler.load_weights(self.policy.state_dict())
        return token_counts([len(r) for r in rows], [len(r) for r in responses],
                            batch["prompt_ids"].shape[1], batch["response_ids"].shape[1])

    @staticmethod
    def advantages(batch: dict[str, torch.Tensor], scores: torch.Tensor,
                   group_size: int) -> torch.Tensor:
        """GRPO advantages of outcome scores (groups are contiguous rows)."""
        mask = batch["response_mask"]
        token_scores = torch.zeros_like(mask)
        last = (mask.sum(-1).long() - 1).clamp(min=0)
        token_scores[torch.arange(len(scores)), last] = scores
        group_ids = [i // group_size for i in range(len(scores))]
        advantages, _ = compute_advantage("grpo", token_scores, mask, group_ids=group_ids)
        return advantages

    def update(self, batch: dict[str, torch.Tensor]) -> None:
        """Gradient accumulation over the micro-batches, one clipped AdamW step."""
        mask = batch["response_mask"]
        agg = {"dp_size": 1, "global_num_tokens": mask.sum().item(),
               "global_num_seqs": float(len(mask)), "horizon": float(self.w.response_length)}
        self.optimizer.zero_grad(set_to_none=True)
        for micro in self.micro_batches(batch):
            log_prob = response_log_probs(
                self.policy, {k: micro[k] for k in FORWARD_KEYS}, 1.0)["log_probs"]
            loss, _ = policy_loss("vanilla", old_log_prob=micro["old_log_probs"],
                                  log_prob=log_prob, advantages=micro["advantages"],
                                  response_mask=micro["response_mask"], **agg)
            if self.ref is not None:
                kld = kl_penalty(log_prob, micro["ref_log_probs"], KL_LOSS_TYPE)
                loss = loss + KL_LOSS_COEF * agg_loss(kld, micro["response_mask"],
                                                      "token-mean", **agg)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
        self.optimizer.step()


def run_direct(w: Workload) -> dict[str, Any]:
    """Warm up, then time ``w.iterations`` plain-loop iterations; returns per-iteration records."""
    torch.set_num_threads(w.threads)
    timer = Timer(w.device)
    start = timer.now()
    loop = DirectGRPO(w)
    setup_s = timer.now() - start
    prompts = draw_prompts(w, loop.tokenizer, w.prompts * (w.warmup + w.iterations))
    batches = [prompts[i * w.prompts:(i + 1) * w.prompts] for i in range(w.warmup + w.iterations)]
    for batch in batches[:w.warmup]:
        loop.iteration(batch, Timer(w.device))
    records = []
    cpu_before = cpu_seconds()
    with maybe_profiled(w.profile_dir, "direct"):
        for batch in batches[w.warmup:]:
            records.append(_timed_iteration(loop, batch, timer))
    cpu = cpu_per_iteration(cpu_before, cpu_seconds(), w.iterations)
    return {"records": records, "setup_s": setup_s, "torch_threads": torch.get_num_threads(),
            "params": loop.policy.num_parameters(),
            "non_embedding_params": loop.policy.num_parameters(exclude_embeddings=True),
            **peak_memory_mb(), **cpu}


def _timed_iteration(loop: DirectGRPO, prompts: list[list[int]], timer: Timer) -> dict[str, float]:
    timer.reset()
    start = timer.now()
    tokens = loop.iteration(prompts, timer)
    wall = timer.now() - start
    record = {phase: timer.get(phase) for phase in
              ("generation", "old_log_prob", "ref", "adv", "update", "weight_sync")}
    record["reward"] = 0.0
    record["driver_overhead"] = wall - sum(record.values())  # batching, the loop itself
    return {**record, "iteration": wall, **tokens}
