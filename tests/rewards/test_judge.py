"""LLM judges: templates, the parse rules on fixed generations, and a tiny in-code judge."""

from __future__ import annotations

import math

import pytest
import torch

from rllib_grpo.rewards.judge import (
    JudgeRule,
    fill_template,
    template_error,
    yes_no_token_ids,
    yes_probability,
)
from tests.conftest import EPS64


@pytest.mark.parametrize("template, needle", [
    ("Grade {prompt}", "lacks {response}"),
    ("{response} only", "lacks {prompt}"),
    ("{prompt} {response} {score}", "unknown placeholders ['score']"),
    ("{prompt {response}", "does not parse"),
    (3, "must be a string"),
])
def test_bad_templates_are_refused(template, needle):
    assert needle in template_error(template)


def test_a_good_template_fills_prompt_response_and_ground_truth():
    template = "Q: {prompt}\nA: {response}\nRef: {ground_truth} {{0-10}}"
    assert template_error(template) is None
    messages = [{"role": "system", "content": "s"}, {"role": "user", "content": "1+1?"}]
    assert fill_template(template, messages, "2", 2) == "Q: s\n1+1?\nA: 2\nRef: 2 {0-10}"


@pytest.mark.parametrize("text, expected", [
    ("7", 0.7), ("Rating: 10/10", 1.0), (" 0 ", 0.0), ("I'd say 2.5.", 0.25)])
def test_range_rule_maps_the_first_number_to_0_1(text, expected):
    assert JudgeRule("range", 0, 10).parse(text) == pytest.approx(expected, abs=EPS64 * 4)


@pytest.mark.parametrize("text, needle", [("great!", "no number"), ("11", "outside")])
def test_range_rule_refuses_what_it_cannot_read(text, needle):
    with pytest.raises(ValueError, match=needle):
        JudgeRule("range", 0, 10).parse(text)


def test_rule_errors():
    assert "use one of" in JudgeRule("stars").error()
    assert "high > low" in JudgeRule("range", 5, 5).error()
    assert JudgeRule.from_options({"parse": "range", "range": [1, 5]}) == JudgeRule("range", 1, 5)


def test_yes_probability_is_p_yes_over_p_yes_or_no_in_float64():
    logits = torch.tensor([[2.0, 0.5, -1.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    got = yes_probability(logits, yes_ids=[0, 2], no_ids=[1])
    p = torch.softmax(logits.double(), -1)
    want = ((p[:, 0] + p[:, 2]) / (p[:, 0] + p[:, 2] + p[:, 1])).tolist()
    assert all(math.isclose(g, w, rel_tol=8 * EPS64) for g, w in zip(got, want, strict=True))
    assert got[1] == pytest.approx(2 / 3, rel=8 * EPS64)


def _judge_folder(tmp_path):
    from rllib_grpo.models.loading import build_tiny_causal_lm
    from rllib_grpo.models.tokenizers import build_char_tokenizer

    tokenizer = build_char_tokenizer("0123456789+-*= :abcdefghijklmnopqrstuvwxyz",
                                     added_tokens=("yes", "no"))
    model = build_tiny_causal_lm(tokenizer, seed=1)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    return tmp_path


def test_a_tiny_local_judge_yes_rule_equals_its_forward_pass(tmp_path):
    from transformers import AutoModelForCausalLM

    from rllib_grpo.rllib.algorithm.reward_workers import LocalJudge

    folder = _judge_folder(tmp_path)
    judge = LocalJudge(str(folder), {"parse": "yes", "template": "{prompt}{response} ok:"},
                       dtype="float64", batch_size=2)
    prompts, responses = ["1+2=", "3+4=", "1+1="], ["3", "12", "2"]
    scores = judge.score(prompts, responses, [3, 7, 2])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    yes, no = yes_no_token_ids(judge.tokenizer)
    for prompt, response, score in zip(prompts, responses, scores, strict=True):
        ids = torch.tensor([judge.prompt_ids(prompt, response, None)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[:, -1]
        # Left padding with position ids and a mask: the same float64 ops up to summation
        # order over <= 12 keys.
        assert score == pytest.approx(yes_probability(logits, yes, no)[0],
                                      abs=64 * 12 * EPS64)
        assert 0.0 < score < 1.0


def test_a_tiny_local_judge_range_rule_parses_its_greedy_generation(tmp_path):
    from rllib_grpo.rllib.algorithm.reward_workers import LocalJudge
    from rllib_grpo.samplers import SamplingParams, make_sampler

    folder = _judge_folder(tmp_path)
    options = {"parse": "range", "range": [0, 99], "sampler": "hf", "max_tokens": 3,
               "template": "{prompt}{response}:"}
    judge = LocalJudge(str(folder), options, dtype="float32")
    prompts, responses = ["1+2=", "3+4=", "2+2="], ["3", "7", "9"]
    scores = judge.score(prompts, responses, [None] * 3)
    sampler = make_sampler("hf", model_path=str(folder), dtype="float32")
    groups = sampler.generate([judge.prompt_ids(p, r, None) for p, r in zip(prompts, responses,
                                                                               strict=True)],
                              1, SamplingParams(temperature=0.0, max_tokens=3))
    for group, score in zip(groups, scores, strict=True):
        text = judge.tokenizer.decode(group[0].token_ids, skip_special_tokens=True)
        try:
            expected: float | type = JudgeRule("range", 0, 99).parse(text)
        except ValueError:
            expected = ValueError
        if expected is ValueError:
            assert isinstance(score, ValueError)
        else:
            assert score == expected
