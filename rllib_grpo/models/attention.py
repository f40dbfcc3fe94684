"""Attention as two matmuls and a softmax, for 16-bit compute on CPUs.

torch's ``scaled_dot_product_attention`` runs a flash kernel on CPU; in bf16 its forward
and backward cost 4-5x two plain bf16 matmuls and a float32 softmax at a GRPO learner's
shapes (4 heads of 64, rows of 36-132 tokens), while in float32 the two are within ~20%
of each other either way.  Measured on the 2-core AVX-512 machine (one thread, forward +
backward of one layer's attention, milliseconds; `benchmarks.learner_floor` has the
model's step):

| rows x tokens, mask | fp32 sdpa | fp32 matmul | bf16 sdpa | bf16 matmul |
|---|---|---|---|---|
| 8 x 132, dense bool (shared prompts) | 9.4 | 11.7 | 16.2 | 8.3 |
| 32 x 36, causal | 6.2 | 4.8 | 17.1 | 3.7 |
| 4 x 300 (9 heads, 3 KV heads), causal | | | 46.0 | 40.3 |
| 2 x 576 (9 heads, 3 KV heads), causal | | | 67.4 | 83.4 |

Beyond `MATMUL_MAX_KV_LEN` keys sdpa is the faster and holds no ``q x k`` probabilities for
backward, so the function hands longer rows to it.

`matmul_attention` is registered with transformers' ``AttentionInterface`` as
`MATMUL_ATTENTION`, its masks made as for ``eager`` (additive float, never skipped as
"causal"); it also takes the boolean 4-D masks of `rllib_grpo.models.shared_prefix`.
`prefer_matmul_attention` switches a model to it on CPU with a 16-bit compute dtype, for
the architectures whose attention is exactly ``softmax(q k^T * scaling + mask) v``
(`PLAIN_ATTENTION_MODELS`; no soft-capping or sinks).
"""

from __future__ import annotations

from typing import Any

import torch

MATMUL_ATTENTION = "grpo_matmul"
# Model types whose attention layer calls the interface with nothing but q, k, v, the
# mask, the scaling, dropout and a sliding window (which lives in the mask).
PLAIN_ATTENTION_MODELS = frozenset({"llama", "qwen2", "qwen3", "mistral"})
SIXTEEN_BIT = ("bfloat16", "float16")
MATMUL_MAX_KV_LEN = 256  # longer rows: sdpa (the table above)


def matmul_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                     value: torch.Tensor, attention_mask: torch.Tensor | None,
                     scaling: float | None = None, dropout: float = 0.0,
                     **_: Any) -> tuple[torch.Tensor, None]:
    """``softmax(query key^T * scaling + mask) value``, the softmax in float32 or wider.

    Shapes: ``query`` (batch, heads, q_len, head_dim); ``key``/``value`` (batch,
    kv_heads, kv_len, head_dim), kv heads repeated for grouped-query attention;
    ``attention_mask`` (batch, 1, q_len, kv_len), additive float or boolean (True: attend).
    Returns (batch, q_len, heads, head_dim) as transformers' attention functions do.
    """
    groups = query.shape[1] // key.shape[1]
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask[..., : key.shape[-2]]
    if key.shape[-2] > MATMUL_MAX_KV_LEN:
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            attention_mask = attention_mask.to(query.dtype)
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, scale=scale, enable_gqa=groups > 1,
            dropout_p=dropout if module.training else 0.0)
        return out.transpose(1, 2).contiguous(), None
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    scores = torch.matmul(query, key.transpose(2, 3)) * scale
    if attention_mask is not None:
        if attention_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + attention_mask
    # At least float32 (16-bit scores), the input's own dtype when wider (float64).
    probs = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
    probs = probs.to(query.dtype)
    if dropout and module.training:
        probs = torch.nn.functional.dropout(probs, p=dropout)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), None


def register_matmul_attention() -> None:
    """Make `MATMUL_ATTENTION` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register(MATMUL_ATTENTION, matmul_attention)
    AttentionMaskInterface.register(MATMUL_ATTENTION, eager_mask)


def prefer_matmul_attention(lm: torch.nn.Module, device: torch.device,
                            compute_dtype: str) -> bool:
    """Switch ``lm`` to `MATMUL_ATTENTION` where it pays: a CPU, a 16-bit compute dtype and
    a `PLAIN_ATTENTION_MODELS` architecture.  Returns whether ``lm`` now uses it."""
    base: Any = lm.get_base_model() if hasattr(lm, "get_base_model") else lm  # type: ignore[operator]
    config = getattr(base, "config", None)
    if (device.type != "cpu" or compute_dtype not in SIXTEEN_BIT or config is None
            or getattr(config, "model_type", None) not in PLAIN_ATTENTION_MODELS):
        return False
    register_matmul_attention()
    base.set_attn_implementation(MATMUL_ATTENTION)
    return str(getattr(config, "_attn_implementation", "")) == MATMUL_ATTENTION
