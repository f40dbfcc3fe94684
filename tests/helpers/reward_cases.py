"""The reward functions' cases (response, ground truth, expected score), shared by their
tests and tests/rewards/test_docs.py, which checks the documented examples against them."""

from __future__ import annotations

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


# (case, response, ground truth, scorer kwargs, expected score, expected pred)
MATH_DAPO_CASES = [
    ("right answer scores +1", "Thinking...\nAnswer: 34", "34", {}, 1.0, "34"),
    ("wrong answer scores -1", "Answer: 35", "34", {}, -1.0, "35"),
    ("no answer scores -1", "I do not know.", "34", {}, -1.0, None),
    ("last Answer: line wins", "Answer: 12\nAnswer: 34", "34", {}, 1.0, "34"),
    ("last Answer: on one line wins", "Answer: 12, no: Answer: 34", "34", {}, 1.0, "34"),
    ("Minerva normalisation", "Answer: $\\frac12$", "\\frac{1}{2}", {}, 1.0, "\\frac{1}{2}"),
    ("units dropped", "Answer: 5 degrees", "5", {}, 1.0, "5"),
    ("thousands comma", "Answer: 1,000", "1000", {}, 1.0, "1000"),
    ("only the last 300 chars", "Answer: 34\n" + "x" * 300, "34", {}, -1.0, None),
    ("boxed fallback", "so it is \\boxed{34}", "34", {}, 1.0, "34"),
    ("boxed fallback compares verbatim", "so it is \\boxed{34.0}", "34", {}, -1.0, "34.0"),
]


SCORES_0 = "the sample scores 0 with `reward_error`; counted, logged, training goes on"


STOPS = "`RewardContractError`: the run stops, naming the function, its file and the value"


# (what the reward function does, its body, what follows): docs/rewards.md's failure
# table is generated from these rows (tests/rewards/test_docs.py).
FAILURE_CASES = [
    ("raises", "raise KeyError('boom')", SCORES_0),
    ("exits", "raise SystemExit(3)", SCORES_0),
    ("runs longer than `timeout_s`", "time.sleep(1.0)", SCORES_0),
    ("returns no number", "return '1.0'", SCORES_0),
    ("returns NaN", "return math.nan", SCORES_0),
    ("returns a score infinite in float32", "return 1e39", SCORES_0),
    ("returns a dict whose score is no number", "return {'score': 'high'}", SCORES_0),
    ("returns None", "return None", STOPS),
    ("returns a dict without `score`", "return {'acc': True}", STOPS),
]
