"""Arithmetic (last integer) and countdown (safe equation check) scorers."""

import pytest

from rllib_grpo.rewards import compute_score
from rllib_grpo.rewards._expr import evaluate_expression
from rllib_grpo.rewards.countdown_score import extract_countdown_equation
from tests.helpers.reward_cases import ARITHMETIC_CASES, COUNTDOWN_CASES


@pytest.mark.parametrize(("case", "response", "truth", "kwargs", "score", "pred"), ARITHMETIC_CASES)
def test_arithmetic_case(case, response, truth, kwargs, score, pred):
    result = compute_score("arithmetic", response, truth, **kwargs)
    assert (result["score"], result["acc"], result["pred"]) == (score, score == 1.0, pred), case


@pytest.mark.parametrize(("case", "response", "truth", "kwargs", "score", "pred"), COUNTDOWN_CASES)
def test_countdown_case(case, response, truth, kwargs, score, pred):
    result = compute_score("countdown", response, truth, **kwargs)
    assert (result["score"], result["pred"]) == (score, pred), case


def test_last_answer_tag_wins():
    text = "<answer>1 + 1</answer> no wait <answer>2 * 3 * 4</answer>"
    assert extract_countdown_equation(text) == "2 * 3 * 4"


def test_division_is_exact():
    value, literals = evaluate_expression("7 / 3 * 3")
    assert value == 7 and literals == [7, 3, 3]


@pytest.mark.parametrize("text", ["-2 + 3", "2.5 * 2", "True + 1", "(" * 150 + "1" + ")" * 150])
def test_evaluator_refuses_unary_minus_floats_bools_and_deep_nesting(text):
    with pytest.raises(ValueError):
        evaluate_expression(text)


def test_unary_minus_allowed_on_request():
    assert evaluate_expression("3*-4", allow_unary_minus=True)[0] == -12
