"""verl's DAPO scorer (``math_dapo``): +1/-1, last ``Answer:`` of the last 300 characters,
Minerva normalisation, boxed fallback; dispatched for math_dapo and every aime* source."""

import pytest

from rllib_grpo.rewards import compute_score, known_data_sources
from rllib_grpo.rewards.math_dapo_score import normalize_final_answer
from tests.helpers.reward_cases import MATH_DAPO_CASES


@pytest.mark.parametrize(("case", "response", "truth", "kwargs", "score", "pred"), MATH_DAPO_CASES)
def test_math_dapo_case(case, response, truth, kwargs, score, pred):
    result = compute_score("math_dapo", response, truth, **kwargs)
    assert (result["score"], result["pred"]) == (score, pred), case
    assert result["acc"] is (score == 1.0)


@pytest.mark.parametrize("data_source", ["math_dapo", "math_dapo_reasoning", "aime", "aime2024",
                                         "aime_2025"])
def test_verl_dapo_data_sources_dispatch_to_the_plus_minus_one_scorer(data_source):
    assert compute_score(data_source, "Answer: 7", "8")["score"] == -1.0
    assert compute_score(data_source, "Answer: 8", "8")["score"] == 1.0


def test_aime_prefix_is_listed_and_math_keeps_the_zero_one_scorer():
    assert "aime*" in known_data_sources()
    assert compute_score("math", "Answer: 7", "8")["score"] == 0.0


def test_normalize_final_answer_follows_minerva():
    assert normalize_final_answer("x = \\text{5 cm}") == "5"
    assert normalize_final_answer("\\sqrt2") == "\\sqrt{2}"
