"""A saved sequence-classification reward model scores as calling it by hand does."""

from __future__ import annotations

import json

import pytest
import torch

from rllib_grpo.models.reward_models import build_tiny_reward_model
from rllib_grpo.models.tokenizers import build_char_tokenizer
from rllib_grpo.rewards.reward_model import (
    SequenceClassifierReward,
    classifier_folder_error,
    render_for_reward_model,
)
from tests.conftest import EPS64

ALPHABET = "0123456789+-*= abcdefghijklmnopqrstuvwxyz:"
# A chat template of our own: the reward model must score the rendered conversation.
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}="
            "{% endfor %}")


@pytest.fixture(scope="module")
def rm_folder(tmp_path_factory):
    tokenizer = build_char_tokenizer(ALPHABET)
    tokenizer.chat_template = TEMPLATE
    model = build_tiny_reward_model(tokenizer, seed=3)
    folder = tmp_path_factory.mktemp("rm")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_scores_equal_the_model_called_by_hand_with_its_chat_template(rm_folder):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    prompts = ["1+2=", [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": "3+4="}], "12+30="]
    responses = ["3", "seven", "42 is it"]
    scorer = SequenceClassifierReward(str(rm_folder), dtype="float64", batch_size=2)
    scores = scorer.score(prompts, responses)

    tokenizer = AutoTokenizer.from_pretrained(rm_folder)
    model = AutoModelForSequenceClassification.from_pretrained(rm_folder, dtype=torch.float64)
    assert render_for_reward_model(tokenizer, prompts[0], responses[0]) == "u:1+2==a:3="
    by_hand = []
    for prompt, response in zip(prompts, responses, strict=True):
        messages = ([{"role": "user", "content": prompt}] if isinstance(prompt, str)
                    else prompt) + [{"role": "assistant", "content": response}]
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        ids = torch.tensor([tokenizer.encode(text, add_special_tokens=False)])
        with torch.no_grad():
            by_hand.append(float(model(input_ids=ids).logits[0, 0]))
    # Same float64 ops; the padded batch only adds masked keys (exact zeros after softmax)
    # and another summation order: <= 24 positions x 64 hidden units, eps64 each.
    for got, want in zip(scores, by_hand, strict=True):
        assert abs(got - want) <= 64 * 24 * EPS64 * max(1.0, abs(want))
    assert len(set(scores)) == 3  # the prompt and response reach the score


def test_a_causal_lm_or_a_multi_label_folder_is_no_reward_model(tmp_path, rm_folder):
    assert classifier_folder_error(rm_folder) is None
    assert "no config.json" in classifier_folder_error(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    assert "not a sequence-classification model" in classifier_folder_error(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForSequenceClassification"], "id2label": {"0": "a", "1": "b"}}))
    assert "2 labels" in classifier_folder_error(tmp_path)
