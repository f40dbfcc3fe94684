"""Supervised warm-up (SFT before RL, in miniature) for the built-in models."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
)


def sft_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int = 100,
    lr: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """Supervised fine-tuning on ``(prompt, response)`` pairs, in place.

    The loss covers the response tokens and the EOS after them, not the
    prompt: the model learns to answer and to stop.  Batches are drawn with a
    generator seeded by ``seed``.  Returns the loss of every step; leaves the
    model in eval mode.
    """
    if not pairs:
        raise ValueError("sft_warmup needs at least one (prompt, response) pair")
    examples = [_encode_pair(tokenizer, prompt, response) for prompt, response in pairs]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return sft_on_examples(model, examples, pad_id=pad_id, steps=steps, lr=lr,
                           batch_size=batch_size, seed=seed, max_grad_norm=max_grad_norm)


def sft_on_examples(
    model: PreTrainedModel,
    examples: Sequence[tuple[list[int], list[int]]],
    *,
    pad_id: int,
    steps: int = 100,
    lr: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """Supervised fine-tuning on ``(token ids, labels)`` examples, in place.

    ``labels`` hold the target id where the loss applies and -100 elsewhere
    (e.g. a multi-turn conversation: the model's turns only).  Returns the loss
    of every step; leaves the model in eval mode.
    """
    if not examples:
        raise ValueError("sft_on_examples needs at least one example")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        input_ids, labels, attention_mask = _right_padded_batch(
            [examples[i] for i in picks], pad_id
        )
        loss = model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            labels=labels.to(device),
        ).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _encode_pair(
    tokenizer: PreTrainedTokenizerBase, prompt: str, response: str
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + response + EOS, and labels that mask the prompt out."""
    if tokenizer.eos_token_id is None:
        raise ValueError("sft_warmup needs a tokenizer with an eos token")
    prompt_ids = tokenizer.encode(prompt)
    response_ids = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
    return prompt_ids + response_ids, [-100] * len(prompt_ids) + response_ids


def _right_padded_batch(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:

    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(row_labels)
        attention_mask[row, : len(ids)] = 1
    return input_ids, labels, attention_mask

