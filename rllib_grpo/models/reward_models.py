"""Small reward models built in code: ``"builtin:tiny-rm"`` and ``"builtin:demo-rm"``.

* ``builtin:tiny-rm``: a randomly initialised character-level
  ``LlamaForSequenceClassification`` (num_labels=1) for tests: a built-in reward model
  name that resolves to a saved folder.
* ``builtin:demo-rm``: the same architecture trained in a few seconds with the
  Bradley-Terry loss ``-log sigmoid(r(chosen) - r(rejected))`` (as TRL's RewardTrainer) on
  pairs of arithmetic prompts answered with an *even* number (chosen) and with an odd number
  or no number (rejected): a reward model that prefers answers of a given form, for the
  reward-model demo (docs/reward-models.md).  It never sees the sums, so GRPO on it alone
  teaches even answers, right or wrong.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForSequenceClassification, PreTrainedModel

from rllib_grpo.envs.arithmetic import ARITHMETIC_ALPHABET, make_arithmetic_records
from rllib_grpo.models.loading import ModelAndTokenizer
from rllib_grpo.models.model_registry import register_builtin_model
from rllib_grpo.models.tokenizers import build_char_tokenizer

TINY_RM_PARAMS: dict[str, Any] = {"seed": 0, "hidden_size": 64, "num_layers": 2,
                                  "num_heads": 2, "intermediate_size": 128}
DEMO_RM_PARAMS: dict[str, Any] = {**TINY_RM_PARAMS, "version": 1, "max_operand": 4,
                                  "steps": 80, "lr": 3e-3, "batch_size": 32}


def build_tiny_reward_model(tokenizer: Any, *, seed: int = 0, hidden_size: int = 64,
                            num_layers: int = 2, num_heads: int = 2,
                            intermediate_size: int = 128) -> PreTrainedModel:
    """A randomly initialised fp32 ``LlamaForSequenceClassification`` with one label."""
    config = AutoConfig.for_model(
        "llama", vocab_size=len(tokenizer), hidden_size=hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=1,
        intermediate_size=intermediate_size, max_position_embeddings=128, num_labels=1,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return AutoModelForSequenceClassification.from_config(config, dtype=torch.float32)


def reward_scores(model: PreTrainedModel, tokenizer: Any, texts: Sequence[str]) -> torch.Tensor:
    """``logits[:, 0]`` of ``texts`` (right-padded, no special tokens added), with grad."""
    inputs = tokenizer(list(texts), return_tensors="pt", padding=True, padding_side="right",
                       add_special_tokens=False)
    return model(input_ids=inputs["input_ids"],
                 attention_mask=inputs["attention_mask"]).logits[:, 0]


def train_preference_model(model: PreTrainedModel, tokenizer: Any,
                           make_pair: Callable[[random.Random], tuple[str, str]], *,
                           steps: int, lr: float, batch_size: int, seed: int = 0) -> list[float]:
    """Bradley-Terry training on pairs from ``make_pair(rng) -> (chosen, rejected)``; the
    loss of each step."""
    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    losses = []
    for _ in range(steps):
        chosen, rejected = zip(*(make_pair(rng) for _ in range(batch_size)), strict=True)
        scores = reward_scores(model, tokenizer, [*chosen, *rejected])
        loss = -torch.nn.functional.logsigmoid(scores[:batch_size] - scores[batch_size:]).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def is_even_answer(response: str) -> bool:
    """The demo reward model's form: the response is a non-negative even integer."""
    return response.isdigit() and int(response) % 2 == 0


def even_answer_pair(prompts: Sequence[str]) -> Callable[[random.Random], tuple[str, str]]:
    """``make_pair`` for the demo: a prompt answered evenly vs oddly (or not with a number)."""
    def make_pair(rng: random.Random) -> tuple[str, str]:
        prompt = rng.choice(prompts)
        even = str(2 * rng.randint(0, 9))
        if rng.random() < 0.7:
            odd = str(2 * rng.randint(0, 9) + 1)
        else:
            odd = "".join(rng.choice(ARITHMETIC_ALPHABET) for _ in range(rng.randint(1, 4)))
            odd = odd if not is_even_answer(odd) else odd + "1"
        return prompt + even, prompt + odd
    return make_pair


def _build_tiny_rm(*, seed: int, **model_kwargs: Any) -> ModelAndTokenizer:
    tokenizer = build_char_tokenizer(ARITHMETIC_ALPHABET)
    return build_tiny_reward_model(tokenizer, seed=seed, **model_kwargs), tokenizer


def build_demo_reward_model(*, version: int, seed: int, max_operand: int, steps: int,
                            lr: float, batch_size: int, **model_kwargs: Any) -> ModelAndTokenizer:
    """The demo's reward model (module docstring), trained on the demo's prompts."""
    tokenizer = build_char_tokenizer(ARITHMETIC_ALPHABET)
    model = build_tiny_reward_model(tokenizer, seed=seed, **model_kwargs)
    records = make_arithmetic_records(256, seed=seed, max_operand=max_operand,
                                      prompt_style="plain")
    prompts = sorted({str(r["prompt"] if isinstance(r, dict) else r.prompt) for r in records})
    train_preference_model(model, tokenizer, even_answer_pair(prompts), steps=steps, lr=lr,
                           batch_size=batch_size, seed=seed)
    return model, tokenizer


register_builtin_model("builtin:tiny-rm", _build_tiny_rm, params=TINY_RM_PARAMS)
register_builtin_model("builtin:demo-rm", build_demo_reward_model, params=DEMO_RM_PARAMS)
