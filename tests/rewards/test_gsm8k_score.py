"""GSM8K scorer: verl's quirks (docs/grpo-semantics.md 6.3) are fixed, and wrong answers still fail."""

import pytest

from rllib_grpo.rewards import compute_score, extract_gsm8k_answer, score_gsm8k
from tests.helpers.reward_cases import GSM8K_CASES


@pytest.mark.parametrize(("case", "response", "truth", "kwargs", "score", "pred"), GSM8K_CASES)
def test_gsm8k_case(case, response, truth, kwargs, score, pred):
    result = compute_score("openai/gsm8k", response, truth, **kwargs)
    assert result["score"] == score, case
    assert result["acc"] is (score == 1.0)
    assert result["pred"] == pred


def test_short_and_verl_names_dispatch_to_the_same_scorer():
    assert compute_score("gsm8k", "#### 5", "5") == compute_score("openai/gsm8k", "#### 5", "5")


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="strict"):
        score_gsm8k("#### 5", "5", method="lenient")


def test_extract_takes_the_first_number_after_the_marker():
    assert extract_gsm8k_answer("#### 30 apples, 2 baskets") == "30"
