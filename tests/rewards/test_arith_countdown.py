"""Arithmetic (last integer) and countdown (safe equation check) scorers."""

import pytest

from rllib_grpo.rewards import compute_score
from rllib_grpo.rewards._expr import evaluate_expression
from rllib_grpo.rewards.countdown_score import extract_countdown_equation

# (case, response, ground truth, scorer kwargs, expected score, expected pred)
ARITHMETIC_CASES = [
    ("bare number", "7", 7, {}, 1.0, "7"),
    ("equals sign", "= 7", 7, {}, 1.0, "7"),
    ("trailing period", "7.", 7, {}, 1.0, "7"),
    ("#### marker", "#### 7", 7, {}, 1.0, "7"),
    ("string ground truth", "7", "7", {}, 1.0, "7"),
    ("negative", "-3", -3, {}, 1.0, "-3"),
    ("unicode minus", "\u22123", -3, {}, 1.0, "-3"),
    ("last number counts", "3+4=7", 7, {}, 1.0, "7"),
    ("earlier right answer, last wrong", "7 or maybe 8", 7, {}, 0.0, "8"),
    ("sign matters", "3", -3, {}, 0.0, "3"),
    ("no number", "=", 7, {}, 0.0, None),
    ("empty response", "", 7, {}, 0.0, None),
]

COUNTDOWN_TRUTH = {"target": 24, "numbers": [2, 3, 4]}

COUNTDOWN_CASES = [
    ("answer tags", "<answer>(2 + 4) * 4 - 0</answer>", COUNTDOWN_TRUTH, {}, 0.0, "(2 + 4) * 4 - 0"),
    ("all numbers once", "<think>..</think><answer>2 * 3 * 4</answer>", COUNTDOWN_TRUTH, {}, 1.0,
     "2 * 3 * 4"),
    ("parentheses and division", "<answer>(3 / 2 + 2) * 4 + 10</answer>",
     {"target": 24, "numbers": [3, 2, 2, 4, 10]}, {}, 1.0, "(3 / 2 + 2) * 4 + 10"),
    ("trailing = target ignored", "<answer>4 * 3 * 2 = 24</answer>", COUNTDOWN_TRUTH, {}, 1.0,
     "4 * 3 * 2"),
    ("last line without tags", "Let me try.\n(4 * 3) * 2", COUNTDOWN_TRUTH, {}, 1.0, "(4 * 3) * 2"),
    ("x and ÷ spellings", "<answer>4 x 3 x 2</answer>", COUNTDOWN_TRUTH, {}, 1.0, "4 * 3 * 2"),
    ("JSON-string ground truth", "<answer>2*3*4</answer>", '{"target": 24, "numbers": [2, 3, 4]}',
     {}, 1.0, "2*3*4"),
    ("number used twice", "<answer>4 * 3 * 2 * 1 * 1</answer>", {"target": 24, "numbers": [1, 2, 3, 4]},
     {}, 0.0, "4 * 3 * 2 * 1 * 1"),
    ("number missing (exactly once)", "<answer>4 * 3 * 2</answer>", {"target": 24, "numbers": [1, 2, 3, 4]},
     {}, 0.0, "4 * 3 * 2"),
    ("number missing, use_all_numbers=False", "<answer>4 * 3 * 2</answer>",
     {"target": 24, "numbers": [1, 2, 3, 4]}, {"use_all_numbers": False}, 1.0, "4 * 3 * 2"),
    ("number not given", "<answer>6 * 4</answer>", COUNTDOWN_TRUTH, {}, 0.0, "6 * 4"),
    ("wrong value", "<answer>2 + 3 + 4</answer>", COUNTDOWN_TRUTH, {}, 0.0, "2 + 3 + 4"),
    ("division by zero", "<answer>2 / (3 - 3) * 4</answer>", COUNTDOWN_TRUTH, {}, 0.0, None),
    ("power operator refused", "<answer>2 ** 3 * 3</answer>", COUNTDOWN_TRUTH, {}, 0.0, None),
    ("code is never run", "<answer>__import__('os').getcwd()</answer>", COUNTDOWN_TRUTH, {}, 0.0, None),
    ("no equation", "", COUNTDOWN_TRUTH, {}, 0.0, None),
]


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
