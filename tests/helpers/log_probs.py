"""The reference a sampler's log-probs are checked against: one forward pass of the model.

A sampler reports "processed" log-probs, ``log_softmax(filtered(logits / temperature))``
after top-k and top-p filtering (`rllib_grpo.samplers.base`); `forward_log_probs` computes
the same from the model's logits, and `max_log_prob_diff` compares a sampler's samples
with it (verl reports the same figure as ``rollout_probs_diff_max``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rllib_grpo.samplers.base import Sample, SamplingParams


def filtered_logits(logits: torch.Tensor, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Set logits outside the top-k / top-p (nucleus) set to ``-inf`` (last dim is the vocab).

    Top-k first, then top-p over what is left, as transformers and vLLM do;
    the most likely token always survives.
    """
    if 0 < top_k < logits.shape[-1]:
        kth_best = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        # Ascending cumulative mass, cut at 1 - top_p: the exact rule of both engines.
        sorted_logits, order = torch.sort(logits, dim=-1)
        drop_sorted = sorted_logits.softmax(-1).cumsum(-1) <= 1 - top_p
        drop_sorted[..., -1] = False
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return logits


@torch.no_grad()
def forward_log_probs(
    model: torch.nn.Module,
    prompt_ids: Sequence[int],
    response_ids: Sequence[int],
    *,
    temperature: float = 1.0,
    top_k: int = -1,
    top_p: float = 1.0,
) -> torch.Tensor:
    """Processed log-probs of ``response_ids`` after ``prompt_ids``, from one forward pass.

    The reference a sampler's ``Sample.log_probs`` must match: fp32
    ``log_softmax(filtered(logits / temperature))`` at each response token.
    """
    device = next(model.parameters()).device
    ids = torch.tensor([[*prompt_ids, *response_ids]], device=device)
    logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    if temperature > 0:
        logits = logits / temperature
    log_probs = filtered_logits(logits, top_k, top_p).log_softmax(-1)
    targets = torch.tensor(response_ids, device=device)
    return log_probs.gather(-1, targets[:, None])[:, 0].cpu()


def max_log_prob_diff(
    model: torch.nn.Module,
    prompts: Sequence[Sequence[int]],
    groups: Sequence[Sequence[Sample]],
    params: SamplingParams,
) -> float:
    """Largest ``|sampler log-prob - forward log-prob|`` over all sampled tokens.

    A check of a sampler against the trainer's model (verl reports the same
    as ``rollout_probs_diff_max``); 0 for no tokens.
    """
    diffs = [
        (forward_log_probs(model, prompt, sample.token_ids, **_filters(params)))
        .sub(torch.tensor(sample.log_probs))
        .abs()
        .max()
        .item()
        for prompt, group in zip(prompts, groups, strict=True)
        for sample in group
        if sample.token_ids
    ]
    return max(diffs, default=0.0)


def mean_log_prob(groups: Sequence[Sequence[Sample]]) -> float:
    """Mean log-prob of the sampled tokens (an entropy estimate, negated); 0 for no tokens.

    Near 0 means a near-deterministic policy, for which log-prob checks prove little.
    """
    log_probs = [lp for group in groups for sample in group for lp in sample.log_probs]
    return sum(log_probs) / len(log_probs) if log_probs else 0.0


def _filters(params: SamplingParams) -> dict[str, Any]:
    if params.temperature == 0:  # greedy: the engines ignore top-k/top-p and temperature
        return {"temperature": 0.0}
    return {"temperature": params.temperature, "top_k": params.top_k, "top_p": params.top_p}
