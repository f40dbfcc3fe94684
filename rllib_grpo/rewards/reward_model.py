"""Reward models: a saved Hugging Face sequence-classification model scores (prompt, response).

As TRL's ``GRPOTrainer`` does for a model in ``reward_funcs``: the model loads as
``AutoModelForSequenceClassification(num_labels=1)``; the conversation (the prompt's
messages, then the response as the assistant's turn) is rendered with the reward model's
own tokenizer's chat template; the texts are tokenized together (right padding, no special
tokens added: the template wrote them) and the score is ``logits[:, 0]``.  A tokenizer
without a chat template scores the prompt text followed by the response.

`SequenceClassifierReward` runs in whatever process holds it: the reward actors of
`rllib_grpo.rllib.algorithm.reward_workers`, or in process (tests, benchmarks).
`classifier_folder_error` is the door's check of a folder.  torch and transformers load
lazily.  No Ray here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Prompt = str | list[dict[str, str]]
CLASSIFIER_SUFFIX = "ForSequenceClassification"


def conversation(prompt: Prompt, response: str) -> list[dict[str, str]]:
    """The prompt's messages (a string is one user message) and the response as the
    assistant's turn."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    return [*messages, {"role": "assistant", "content": response}]


def render_for_reward_model(tokenizer: Any, prompt: Prompt, response: str) -> str:
    """The text a reward model scores: the conversation through the tokenizer's chat template
    (TRL's ``apply_chat_template({"messages": prompt + completion})``), or without one the
    prompt's text followed by the response."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(conversation(prompt, response), tokenize=False)
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return text + response


def classifier_folder_error(folder: str | Path) -> str | None:
    """Why ``folder`` (a resolved local folder) is no sequence-classification model, or None.

    Its ``config.json`` must name a ``*ForSequenceClassification`` architecture: a causal
    LM loaded as a classifier gets a randomly initialised head, which scores noise."""
    path = Path(folder).expanduser()
    config_file = path / "config.json"
    if not config_file.is_file():
        return f"{folder}: no config.json, not a saved Hugging Face model"
    try:
        config = json.loads(config_file.read_text())
    except (OSError, ValueError) as err:
        return f"{folder}/config.json does not read as JSON ({err})"
    architectures = config.get("architectures") or []
    if not any(str(a).endswith(CLASSIFIER_SUFFIX) for a in architectures):
        return (f"{folder} holds {', '.join(architectures) or 'a model of no architecture'}, "
                f"not a sequence-classification model (*{CLASSIFIER_SUFFIX}): a reward model "
                "is saved from AutoModelForSequenceClassification(num_labels=1); for a causal "
                "LM as the judge use {'type': 'judge', 'model': ...}")
    labels = config.get("num_labels", len(config.get("id2label") or {0: 0}))
    if labels != 1:
        return (f"{folder} is a classifier with {labels} labels; a reward model has one "
                "(num_labels=1, the score is logits[:, 0])")
    return None


class SequenceClassifierReward:
    """Scores (prompt, response) pairs with a sequence-classification reward model.

    Args:
        path: a local folder (resolved: built-ins and hub ids are resolved by the caller).
        dtype: the weights' dtype (``"float32"``, ``"bfloat16"``, ...).
        device: where it runs (``"cpu"``, ``"cuda"``); None: CUDA when present.
        batch_size: samples per forward pass.
    """

    def __init__(self, path: str, *, dtype: str = "float32", device: str | None = None,
                 batch_size: int = 64) -> None:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, dtype=getattr(torch, dtype)).to(self.device).eval()
        if self.model.config.pad_token_id is None:
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.batch_size = max(1, int(batch_size))
        self.num_parameters = sum(p.numel() for p in self.model.parameters())

    def render(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[str]:
        """The texts the model scores (`render_for_reward_model`)."""
        return [render_for_reward_model(self.tokenizer, p, r)
                for p, r in zip(prompts, responses, strict=True)]

    def score(self, prompts: Sequence[Prompt], responses: Sequence[str]) -> list[float]:
        """One score per pair, ``batch_size`` pairs per forward pass."""
        import torch

        texts = self.render(prompts, responses)
        scores: list[float] = []
        with torch.inference_mode():
            for start in range(0, len(texts), self.batch_size):
                inputs = self.tokenizer(texts[start:start + self.batch_size],
                                        return_tensors="pt", padding=True,
                                        padding_side="right", add_special_tokens=False)
                inputs = {k: v.to(self.device) for k, v in inputs.items()
                          if k in ("input_ids", "attention_mask")}
                scores += self.model(**inputs).logits[:, 0].double().tolist()
        return scores
