"""MATH scorer: boxed extraction with nested braces, Hendrycks normalisation and sympy."""

import pytest

from rllib_grpo.rewards import compute_score, extract_boxed, extract_math_answer
from rllib_grpo.rewards._latex import latex_to_sympy_syntax
from tests.helpers.reward_cases import MATH_CASES


@pytest.mark.parametrize(("case", "response", "truth", "kwargs", "score", "pred"), MATH_CASES)
def test_math_case(case, response, truth, kwargs, score, pred):
    result = compute_score("math", response, truth, **kwargs)
    assert result["score"] == score, case
    assert result["pred"] == pred


@pytest.mark.parametrize(
    "data_source", ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]
)
def test_verl_math_names_dispatch_to_the_math_scorer(data_source):
    assert compute_score(data_source, r"\boxed{\frac12}", "0.5")["score"] == 1.0


def test_boxed_extraction_matches_nested_braces():
    assert extract_boxed(r"a \boxed{\frac{a}{b^{2}}} b") == r"\frac{a}{b^{2}}"


def test_boxed_ground_truth_is_unwrapped():
    assert compute_score("math", r"\boxed{4}", r"\boxed{4}")["score"] == 1.0


def test_answer_fallback_strips_dollars_and_period():
    assert extract_math_answer("Answer: $\\frac{1}{2}$.") == r"\frac{1}{2}"


@pytest.mark.parametrize(
    "latex",
    ["__import__", r"\text{os}", "exec(1)", "lambda", "a.b", "'x'", "x" * 300],
)
def test_unsafe_or_unsupported_text_never_reaches_sympy(latex):
    assert latex_to_sympy_syntax(latex) is None


def test_rewrite_to_sympy_syntax():
    assert latex_to_sympy_syntax(r"\frac{\sqrt{3}}{2}\pi") == "((sqrt(3))/(2))pi"
