"""MATH scorer: boxed extraction with nested braces, Hendrycks normalisation and sympy."""

import pytest

from rllib_grpo.rewards import compute_score, extract_boxed, extract_math_answer
from rllib_grpo.rewards._latex import latex_to_sympy_syntax

# (case, response, ground truth, scorer kwargs, expected score, expected pred)
MATH_CASES = [
    ("plain boxed", r"So $x = \boxed{6}$.", "6", {}, 1.0, "6"),
    ("nested braces", r"\boxed{\frac{\sqrt{3}}{2}}", r"\frac{\sqrt3}{2}", {}, 1.0, r"\frac{\sqrt{3}}{2}"),
    ("last box wins", r"first \boxed{5}, corrected: \boxed{7}", "7", {}, 1.0, "7"),
    ("fbox", r"\fbox{7}", "7", {}, 1.0, "7"),
    ("boxed with space", r"$\boxed 5$", "5", {}, 1.0, "5"),
    ("\\frac12 shorthand", r"\boxed{\frac12}", r"\frac{1}{2}", {}, 1.0, r"\frac12"),
    ("0.5 vs \\frac{1}{2}", r"\boxed{0.5}", r"\frac{1}{2}", {}, 1.0, "0.5"),
    ("\\dfrac", r"\boxed{\dfrac{1}{2}}", r"\frac12", {}, 1.0, r"\dfrac{1}{2}"),
    ("\\tfrac vs decimal", r"\boxed{\tfrac{3}{4}}", "0.75", {}, 1.0, r"\tfrac{3}{4}"),
    ("a/b vs \\frac", r"\boxed{1/3}", r"\frac{1}{3}", {}, 1.0, "1/3"),
    ("spaces", r"\boxed{ 5 \sqrt{2} }", r"5\sqrt{2}", {}, 1.0, r"5 \sqrt{2}"),
    ("\\left( \\right)", r"\boxed{(3,\frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", {}, 1.0,
     r"(3,\frac{\pi}{2})"),
    ("degrees", r"\boxed{120^\circ}", "120", {}, 1.0, r"120^\circ"),
    ("degrees with braces", r"\boxed{30^{\circ}}", r"30^\circ", {}, 1.0, r"30^{\circ}"),
    ("\\text units", r"\boxed{10\text{ cm}}", "10", {}, 1.0, r"10\text{ cm}"),
    ("\\text answer", r"\boxed{\text{Thursday}}", r"\text{Thursday}", {}, 1.0, r"\text{Thursday}"),
    ("\\! thousands", r"\boxed{12,\!000}", r"12{,}000", {}, 1.0, r"12,\!000"),
    ("dollars", r"\boxed{\$5}", "5", {}, 1.0, r"\$5"),
    ("x = prefix", r"\boxed{x=5}", "5", {}, 1.0, "x=5"),
    ("sympy: simplified radical", r"\boxed{\sqrt{8}}", r"2\sqrt{2}", {}, 1.0, r"\sqrt{8}"),
    ("sympy: expanded polynomial", r"\boxed{x^2+2x+1}", "(x+1)^2", {}, 1.0, "x^2+2x+1"),
    ("sympy: cube root", r"\boxed{\sqrt[3]{8}}", "2", {}, 1.0, r"\sqrt[3]{8}"),
    ("Answer: fallback", "So the total is 12.\nAnswer: 12", "12", {}, 1.0, "12"),
    ("last Answer: on one line wins", "Answer: 10. No wait, Answer: 12", "12", {}, 1.0, "12"),
    ("wrong value", r"\boxed{\frac{1}{3}}", "0.333", {}, 0.0, r"\frac{1}{3}"),
    ("wrong polynomial", r"\boxed{x^2+1}", "(x+1)^2", {}, 0.0, "x^2+1"),
    ("tuple order matters", r"\boxed{(1,4)}", "(4,1)", {}, 0.0, "(1,4)"),
    ("interval brackets matter", r"\boxed{[1,2)}", "(1,2)", {}, 0.0, "[1,2)"),
    ("power tower refused", r"\boxed{9^{9^{9}}}", "1", {}, 0.0, "9^{9^{9}}"),
    ("no box", "The answer is 6.", "6", {}, 0.0, None),
    ("unbalanced box", r"\boxed{6", "6", {}, 0.0, None),
    ("empty box", r"\boxed{}", "6", {}, 0.0, None),
    ("empty response", "", "6", {}, 0.0, None),
]


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
