"""Log-probs of chosen tokens and entropies over a large vocabulary, a chunk of tokens at a
time, with a hand-written backward (pure torch).

`logprobs_from_logits` / `entropy_from_logits` under autograd keep several ``(N, V)``
float32 tensors alive for backward (the cast logits, the softmax, ``softmax * logits``)
and make as many passes over them: at SmolLM2's 49k vocabulary and 1k response tokens
each is 200 MB.  `chunked_token_stats` computes the same values chunk by chunk and
saves only the inputs and one log-sum-exp per token; backward recomputes each chunk's
softmax.  Given ``weight`` it is also fused with the LM head: the inputs are hidden
states, each chunk's logits are ``hidden @ weight.T`` and the full ``(N, V)`` logits
are never stored (forward or backward).

Values equal the unchunked formulas (``z = logits / T``, ``log p = z[y] - lse(z)``,
``H = lse(z) - Σ softmax(z)·z``): the same operations per row, rounded the same way in
float64 (``tests/algos/test_token_stats.py``).  Gradients: ``∂log p/∂z = onehot(y) - p``,
``∂H/∂z = -p·(log p_z + H)``.
"""

from __future__ import annotations

from typing import Any

import torch

# Tokens per chunk: a (chunk, V) float32 block of a 49k vocabulary is 50 MB at 256.
DEFAULT_CHUNK_TOKENS = 256


def _stats_dtype(dtype: torch.dtype) -> torch.dtype:
    # Softmax statistics in 16-bit floats lose most of their precision.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _chunk_logits(inputs: torch.Tensor, weight: torch.Tensor | None, temperature: float,
                  dtype: torch.dtype) -> torch.Tensor:
    """One chunk's ``z = logits / T`` in the statistics dtype (``inputs @ weight.T`` when
    fused: in ``inputs``' dtype, as autocast would run the LM head)."""
    logits = inputs if weight is None else inputs @ weight.t()
    logits = logits.to(dtype)
    return logits / temperature if temperature != 1.0 else logits


class _ChunkedTokenStats(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, inputs: torch.Tensor, weight: torch.Tensor | None,
                labels: torch.Tensor, temperature: float, with_entropy: bool,
                chunk: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(inputs.device.type, enabled=False):  # dtypes as the caller gave
            return _ChunkedTokenStats._forward(ctx, inputs, weight, labels, temperature,
                                               with_entropy, chunk, dtype)

    @staticmethod
    def _forward(ctx: Any, inputs: torch.Tensor, weight: torch.Tensor | None,
                 labels: torch.Tensor, temperature: float, with_entropy: bool,
                 chunk: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        n = inputs.shape[0]
        log_probs = torch.empty(n, dtype=dtype, device=inputs.device)
        lse = torch.empty(n, dtype=dtype, device=inputs.device)
        entropy = torch.empty(n if with_entropy else 0, dtype=dtype, device=inputs.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            z = _chunk_logits(inputs[start:end], weight, temperature, dtype)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[start:end] = chunk_lse
            log_probs[start:end] = z.gather(-1, labels[start:end, None]).squeeze(-1) - chunk_lse
            if with_entropy:
                entropy[start:end] = chunk_lse - (torch.softmax(z, dim=-1) * z).sum(dim=-1)
        ctx.save_for_backward(inputs, weight, labels, lse, entropy)
        ctx.temperature, ctx.with_entropy, ctx.chunk = temperature, with_entropy, chunk
        ctx.mark_non_differentiable(lse)
        return log_probs, entropy

    @staticmethod
    def backward(ctx: Any, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None
                 ) -> tuple[Any, ...]:
        with torch.autocast(ctx.saved_tensors[0].device.type, enabled=False):
            return _ChunkedTokenStats._backward(ctx, grad_log_probs, grad_entropy)

    @staticmethod
    def _backward(ctx: Any, grad_log_probs: torch.Tensor | None,
                  grad_entropy: torch.Tensor | None) -> tuple[Any, ...]:
        inputs, weight, labels, lse, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        dtype = lse.dtype
        need_inputs, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_inputs = torch.empty_like(inputs) if need_inputs else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32 if weight.dtype in (
            torch.float16, torch.bfloat16) else weight.dtype) if need_weight else None
        grad_entropy = grad_entropy if ctx.with_entropy else None
        for start in range(0, inputs.shape[0], chunk):
            end = min(start + chunk, inputs.shape[0])
            rows = inputs[start:end]
            z = _chunk_logits(rows, weight, temperature, dtype)
            log_softmax = z - lse[start:end, None]
            # d/dz of Σ g_lp·log p + g_H·H, written into one (chunk, V) block.
            if grad_entropy is not None:
                probs = log_softmax.exp()
                grad_z = probs * (log_softmax + entropy[start:end, None])
                grad_z.mul_(-grad_entropy[start:end, None])
                if grad_log_probs is not None:
                    grad_z.sub_(probs * grad_log_probs[start:end, None])
            elif grad_log_probs is None:
                grad_z = torch.zeros_like(z)
            else:  # -g·p in place: no other (chunk, V) block
                grad_z = log_softmax.exp_().mul_(-grad_log_probs[start:end, None])
            if grad_log_probs is not None:
                grad_z.scatter_add_(-1, labels[start:end, None], grad_log_probs[start:end, None])
            if temperature != 1.0:
                grad_z.div_(temperature)
            if weight is None:
                if grad_inputs is not None:
                    grad_inputs[start:end] = grad_z.to(inputs.dtype)
                continue
            grad_z = grad_z.to(rows.dtype)  # the LM head's backward in the forward's dtype
            if grad_inputs is not None:
                grad_inputs[start:end] = grad_z @ weight
            if grad_weight is not None:
                grad_weight.add_(grad_z.t() @ rows)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_inputs, grad_weight, None, None, None, None, None


def chunked_token_stats(
    inputs: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    *,
    weight: torch.Tensor | None = None,
    with_entropy: bool = False,
    chunk_size: int = DEFAULT_CHUNK_TOKENS,
    stats_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``labels`` (and entropies) under ``softmax(logits / temperature)``.

    Args:
        inputs: ``(N, V)`` logits, or ``(N, H)`` hidden states when ``weight`` is given.
        labels: ``(N,)`` token ids.
        weight: ``(V, H)`` LM head (no bias): logits are ``inputs @ weight.T``, computed a
            chunk at a time in ``inputs``' dtype (cast ``weight`` to it first under
            autocast), never stored whole.
        with_entropy: also return the entropies (differentiable).
        chunk_size: tokens per chunk.
        stats_dtype: the dtype logits are cast to before the softmax statistics (None:
            float32 for 16-bit inputs, else ``inputs``' dtype; the learner passes float32,
            as its unchunked path rounds every logit to float32).

    Returns:
        ``(log_probs, entropy or None)``, each ``(N,)`` in the statistics dtype.
    """
    if inputs.dim() != 2 or labels.shape != inputs.shape[:1]:
        raise ValueError(f"inputs must be (N, V or H) and labels (N,); got "
                         f"{tuple(inputs.shape)} and {tuple(labels.shape)}")
    if weight is not None and (weight.dim() != 2 or weight.shape[1] != inputs.shape[1]):
        raise ValueError(f"weight must be (V, {inputs.shape[1]}); got {tuple(weight.shape)}")
    log_probs, entropy = _ChunkedTokenStats.apply(
        inputs, weight, labels.long(), float(temperature), bool(with_entropy),
        max(int(chunk_size), 1), stats_dtype or _stats_dtype(inputs.dtype))
    return log_probs, entropy if with_entropy else None
