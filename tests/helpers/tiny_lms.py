"""Tiny transformers LMs (llama, qwen2) and hand-made batches for checks of the forward
pass: padded against packed rows, shared prompts, attention kernels, the LM head."""

from __future__ import annotations

import torch

from tests.conftest import EPS32


def padded_batch(seed: int = 0, rows: int = 8, prompt: int = 6, response: int = 7,
                  vocab: int = 50) -> dict[str, torch.Tensor]:
    """Left-padded prompts (1..prompt tokens), right-padded responses (0..response)."""
    gen = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(1, prompt + 1, (rows,), generator=gen)
    response_lengths = torch.randint(0, response + 1, (rows,), generator=gen)
    response_lengths[0] = 0  # an empty response
    response_lengths[1] = response  # a full one
    batch = {"prompt_ids": torch.zeros(rows, prompt, dtype=torch.long),
             "prompt_mask": torch.zeros(rows, prompt, dtype=torch.long),
             "response_ids": torch.zeros(rows, response, dtype=torch.long),
             "response_mask": torch.zeros(rows, response)}
    for b in range(rows):
        p, r = int(prompt_lengths[b]), int(response_lengths[b])
        batch["prompt_ids"][b, prompt - p:] = torch.randint(4, vocab, (p,), generator=gen)
        batch["prompt_mask"][b, prompt - p:] = 1
        batch["response_ids"][b, :r] = torch.randint(4, vocab, (r,), generator=gen)
        batch["response_mask"][b, :r] = 1
    return batch


def tiny_lm(arch: str, attn: str, dtype: torch.dtype = torch.float32):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(arch, vocab_size=50, hidden_size=64, num_hidden_layers=2,
                                  num_attention_heads=2, num_key_value_heads=1,
                                  intermediate_size=128, max_position_embeddings=64)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).to(dtype).eval()


def log_probs_bound(lm, batch, temperature: float, padded: dict) -> float:
    """How far the float32 log-probs and entropies of two float64 forwards of ``batch``
    can be apart.

    The two forwards' float64 logits agree to ~1e-15, and `response_log_probs` rounds them
    to float32 (`.float()`, then / T) before log-softmax and entropy.  Where a logit rounds
    the other way the inputs are <= 2 float32 roundings apart (2·eps32·Z, Z = max|logits/T|);
    log-softmax is 2-Lipschitz in the max norm and the entropy max(2, 2Z)-Lipschitz, and the
    outputs' own float32 rounding adds 2 ulps (log-softmax) and ~sqrt(V) = 7 ulps (the
    entropy's sum over the V = 50 vocabulary entries) of their scale: < 16 ulps of
    max(Z, |log p|, H) for Z <= 2 (asserted)."""
    ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1)
    attention = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=attention,
                    position_ids=(attention.cumsum(-1) - 1).clamp(min=0)).logits
    z = (logits[attention.bool()] / temperature).abs().max().item()  # real positions
    assert z <= 2.0, z
    mask = batch["response_mask"].bool()
    scale = max(z, *(padded[key][mask].abs().max().item() for key in ("log_probs", "entropy")))
    return 16 * EPS32 * scale


def grouped_batch(seed: int = 0, prompt: int = 6, response: int = 5, vocab: int = 50,
                   groups: tuple[int, ...] = (4, 3, 1)) -> dict[str, torch.Tensor]:
    """``len(groups)`` distinct left-padded prompts, ``groups[g]`` responses each
    (right-padded, 0..response tokens: one empty, one full)."""
    gen = torch.Generator().manual_seed(seed)
    rows = sum(groups)
    batch = {"prompt_ids": torch.zeros(rows, prompt, dtype=torch.long),
             "prompt_mask": torch.zeros(rows, prompt, dtype=torch.long),
             "response_ids": torch.zeros(rows, response, dtype=torch.long),
             "response_mask": torch.zeros(rows, response)}
    b = 0
    for g, size in enumerate(groups):
        p = int(torch.randint(2, prompt + 1, (1,), generator=gen)) if g else prompt
        tokens = torch.randint(4, vocab, (p,), generator=gen)
        for _ in range(size):
            r = int(torch.randint(1, response + 1, (1,), generator=gen))
            r = 0 if b == 1 else response if b == 0 else r
            batch["prompt_ids"][b, prompt - p:] = tokens
            batch["prompt_mask"][b, prompt - p:] = 1
            batch["response_ids"][b, :r] = torch.randint(4, vocab, (r,), generator=gen)
            batch["response_mask"][b, :r] = 1
            b += 1
    return batch


def shared_log_probs(lm, batch, temperature, capacity, token_stats="full"):
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.models.shared_prefix import pack_shared_prompts

    layout = pack_shared_prompts(batch, capacity=capacity)
    return packed_response_log_probs(lm, batch, temperature, with_entropy=True, layout=layout,
                                     token_stats=token_stats)
