"""GSM8K scorer: verl's quirks (docs/grpo-semantics.md 6.3) are fixed, and wrong answers still fail."""

import pytest

from rllib_grpo.rewards import compute_score, extract_gsm8k_answer, score_gsm8k

LONG_TAIL = " Let me double-check with 3 other methods, 42 ways and 7 steps." * 8  # > 300 chars

# (case, response, ground truth, scorer kwargs, expected score, expected pred)
GSM8K_CASES = [
    ("dollar sign after ####", "#### $18", "18", {}, 1.0, "18"),
    ("dollar sign and space", "#### $ 18", "18", {}, 1.0, "18"),
    ("decimal zero vs integer", "#### 18.0", "18", {}, 1.0, "18"),
    ("trailing zero decimal", "#### 24.50", "24.5", {}, 1.0, "24.5"),
    ("trailing period", "So she has 18 left.\n#### 18.", "18", {}, 1.0, "18"),
    ("answer then >300 chars", "#### 18" + LONG_TAIL, "18", {}, 1.0, "18"),
    ("thousands separator in response", "#### 1,000", "1000", {}, 1.0, "1000"),
    ("thousands separator in ground truth", "#### 1000", "1,000", {}, 1.0, "1000"),
    ("space as thousands separator", "#### 1 000", "1000", {}, 1.0, "1000"),
    ("space-separated millions", "#### 1 000 000", "1000000", {}, 1.0, "1000000"),
    ("spaces in ground truth", "#### 1000000", "1 000 000", {}, 1.0, "1000000"),
    ("space-separated near miss", "#### 1 001", "1000", {}, 0.0, "1001"),
    ("spaced number is not its first group", "#### 1 000", "1", {}, 0.0, "1000"),
    ("fraction vs decimal", "#### 3/4", "0.75", {}, 1.0, "0.75"),
    ("fraction near miss", "#### 3/5", "0.75", {}, 0.0, "0.6"),
    ("fraction is not its numerator", "#### 3/4", "3", {}, 0.0, "0.75"),
    ("fraction without finite decimal", "#### 2/6", "1/3", {}, 1.0, "1/3"),
    ("fraction vs rounded decimal", "#### 1/3", "0.333", {}, 0.0, "1/3"),
    ("unicode minus", "#### \u22125", "-5", {}, 1.0, "-5"),
    ("negative number", "It drops to -7 degrees.\n#### -7", "-7", {}, 1.0, "-7"),
    ("sign matters", "#### -5", "5", {}, 0.0, "-5"),
    ("wrong answer", "#### 17", "18", {}, 0.0, "17"),
    ("last #### wins", "#### 12\nWait, I forgot the tip.\n#### 18", "18", {}, 1.0, "18"),
    ("last #### on one line wins", "#### 12 no, #### 18", "18", {}, 1.0, "18"),
    ("empty #### ignored", "#### 18\n####", "18", {}, 1.0, "18"),
    ("ground truth is a full solution", "#### 72", "48+24=72\n#### 72", {}, 1.0, "72"),
    ("strict: no ####", "The answer is 18.", "18", {}, 0.0, None),
    ("flexible: no ####, trailing period", "The answer is 18.", "18", {"method": "flexible"}, 1.0, "18"),
    ("flexible: last number", "3 apples and 4 pears make 7", "7", {"method": "flexible"}, 1.0, "7"),
    ("flexible: binary minus is not a sign", "15-8 gives 7, so 10-3", "3", {"method": "flexible"}, 1.0, "3"),
    ("flexible: #### preferred", "#### 18 and I also counted 20", "18", {"method": "flexible"}, 1.0, "18"),
    ("empty response", "", "18", {}, 0.0, None),
    ("empty response, flexible", "", "18", {"method": "flexible"}, 0.0, None),
    ("no number at all, flexible", "I don't know.", "18", {"method": "flexible"}, 0.0, None),
]


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
