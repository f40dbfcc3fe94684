"""How the learner turns a causal LM's last hidden states into response log-probs and
entropies (``token_stats``), and the LM heads it can fuse with that computation.

* ``"full"``: the model's own forward computes the response logits (``logits_to_keep``),
  then the log-softmax and entropy run over the whole ``(tokens, V)`` float32 tensor
  under autograd (several such tensors kept for backward);
* ``"chunked"``: the same logits, then `rllib_grpo.algos.token_stats.chunked_token_stats`
  (chunks of tokens, a hand-written backward, one ``(chunk, V)`` block at a time);
* ``"fused"``: the decoder's hidden states go into `chunked_token_stats` with the LM head's
  weight: the full logits are never stored (forward or backward).  Only for plain
  transformers LMs whose logits are exactly ``lm_head(hidden)`` (`fused_head`);
* ``"auto"``: ``"fused"`` where `fused_head` allows it, else ``"chunked"``.

No Ray here.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import FSDPModule

TOKEN_STATS_MODES = ("auto", "fused", "chunked", "full")
# Model types whose ForCausalLM forward is ``lm_head(model(...).last_hidden_state)`` and
# nothing else (no logit soft-capping or scaling, as Gemma, Granite and Cohere have).
FUSED_HEAD_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def fused_head(lm: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """``(decoder, lm_head weight)`` when ``lm``'s logits are exactly
    ``decoder(...).last_hidden_state @ weight.T``, else None.

    Only an unwrapped transformers model of `FUSED_HEAD_MODEL_TYPES` with a bias-free
    ``nn.Linear`` head: not a peft wrapper (its head may carry an adapter) and not an FSDP2
    module (its root hooks gather the head's shards in the model's own forward).
    """
    from transformers import PreTrainedModel

    if not isinstance(lm, PreTrainedModel) or isinstance(lm, FSDPModule):
        return None
    head, decoder = getattr(lm, "lm_head", None), getattr(lm, "model", None)
    model_type = getattr(getattr(lm, "config", None), "model_type", None)
    if (model_type not in FUSED_HEAD_MODEL_TYPES or decoder is None
            or type(head) is not torch.nn.Linear or head.bias is not None):
        return None
    return decoder, head.weight


def token_stats_mode(lm: torch.nn.Module, requested: str) -> str:
    """The mode ``requested`` resolves to for ``lm`` (``"auto"``: fused where
    `fused_head` allows it, else chunked); a refused ``"fused"`` raises."""
    if requested not in TOKEN_STATS_MODES:
        raise ValueError(f"token_stats={requested!r}: expected one of {TOKEN_STATS_MODES}")
    if requested == "auto":
        return "fused" if fused_head(lm) is not None else "chunked"
    if requested == "fused" and fused_head(lm) is None:
        raise ValueError(f"token_stats='fused' needs a plain transformers LM of "
                         f"{FUSED_HEAD_MODEL_TYPES} with a bias-free lm_head (got "
                         f"{type(lm).__name__}); use 'auto' or 'chunked'")
    return requested
