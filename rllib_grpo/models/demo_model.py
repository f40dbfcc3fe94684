"""The demo's built-in model, ``"builtin:demo"``.

A randomly initialised model earns no reward on arithmetic, so its groups
carry no signal and GRPO cannot start.  Worse, a model that only learned the
answer *format* (a number, then end-of-sequence) answers independently of the
prompt, and GRPO then collapses onto the most frequent answer (the reward stays
near 0.2).  So the demo does what real pipelines do, SFT then RL, in
miniature: a small character-level transformer gets 30 steps (about a second)
of supervised warm-up on `rllib_grpo/Arithmetic-v0` demonstrations such as
``3+4=`` -> ``7``.  That is far too little to learn the sums: it starts with
about a third of its sampled answers right, reading the operands, and GRPO
takes it from there to 0.9 and above.
"""

from __future__ import annotations

import random
from typing import Any

from rllib_grpo.envs.arithmetic import ARITHMETIC_ALPHABET, make_arithmetic_records
from rllib_grpo.models.loading import ModelAndTokenizer, build_tiny_causal_lm
from rllib_grpo.models.model_registry import register_builtin_model
from rllib_grpo.models.sft import sft_warmup
from rllib_grpo.models.tokenizers import build_char_tokenizer

DEMO_PARAMS: dict[str, Any] = {
    "version": 1,
    "seed": 0,
    "max_operand": 4,
    "num_prompts": 512,
    "warmup_steps": 30,
    "correct_fraction": 1.0,
    "hidden_size": 64,
    "num_layers": 2,
    "num_heads": 2,
    "num_kv_heads": 1,
    "intermediate_size": 256,
}


def _prompt_of(record: Any) -> str:
    prompt = record["prompt"] if isinstance(record, dict) else record.prompt
    if not isinstance(prompt, str):
        raise TypeError("the demo warm-up needs plain-text arithmetic prompts")
    return prompt


def _ground_truth_of(record: Any) -> int:
    return int(record["ground_truth"] if isinstance(record, dict) else record.ground_truth)


def build_demo_model(*, version: int, seed: int, max_operand: int, num_prompts: int,
                     warmup_steps: int, correct_fraction: float,
                     **model_kwargs: Any) -> ModelAndTokenizer:
    """Char-level tiny LM after a short SFT warm-up.

    ``correct_fraction`` of the warm-up targets are the right answers, the rest
    random numbers in the answer range (0 teaches the format only).
    """
    tokenizer = build_char_tokenizer(ARITHMETIC_ALPHABET)
    model = build_tiny_causal_lm(tokenizer, seed=seed, arch="llama", **model_kwargs)
    records = make_arithmetic_records(num_prompts, seed=seed, max_operand=max_operand,
                                      prompt_style="plain")
    rng = random.Random(seed)
    # Right answers make the model read the operands; random ones teach the format only.
    pairs = [
        (_prompt_of(r), str(_ground_truth_of(r) if rng.random() < correct_fraction
                            else rng.randint(0, 2 * max_operand)))
        for r in records
    ]
    sft_warmup(model, tokenizer, pairs, steps=warmup_steps, lr=3e-3, batch_size=32, seed=seed)
    return model, tokenizer


register_builtin_model("builtin:demo", build_demo_model, params=DEMO_PARAMS)
