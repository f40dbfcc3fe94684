"""docs/rewards.md's case table is generated from the reward tests' case tables, and its
failure table from `tests.rewards.test_safety.FAILURE_CASES`.

After changing a case table, regenerate them with ``python -m tests.rewards.test_docs``.
"""

import json

from tests.conftest import REPO_ROOT
from tests.rewards.test_arith_countdown import ARITHMETIC_CASES, COUNTDOWN_CASES
from tests.rewards.test_gsm8k_score import GSM8K_CASES
from tests.rewards.test_math_dapo_score import MATH_DAPO_CASES
from tests.rewards.test_math_score import MATH_CASES
from tests.rewards.test_safety import FAILURE_CASES

DOC = REPO_ROOT / "docs" / "rewards.md"
BEGIN, END = "<!-- cases:begin -->", "<!-- cases:end -->"
FAILURES_BEGIN, FAILURES_END = "<!-- failures:begin -->", "<!-- failures:end -->"
TABLES = [
    ("gsm8k", GSM8K_CASES),
    ("math", MATH_CASES),
    ("math_dapo", MATH_DAPO_CASES),
    ("arithmetic", ARITHMETIC_CASES),
    ("countdown", COUNTDOWN_CASES),
]
MAX_CELL_CHARS = 60


def render_case_table() -> str:
    lines = [
        "| scorer | case | response | ground truth | options | score | pred |",
        "|---|---|---|---|---|---|---|",
    ]
    for scorer, cases in TABLES:
        for case, response, truth, kwargs, score, pred in cases:
            cells = [scorer, case, _code(response), _code(truth), _code(kwargs) if kwargs else "",
                     f"{score:g}", "none" if pred is None else _code(pred)]  # fmt: skip
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _code(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if not text:
        return "(empty)"
    if len(text) > MAX_CELL_CHARS:
        text = text[:MAX_CELL_CHARS] + f"… ({len(text)} chars)"
    return "`" + text.replace("\n", "⏎").replace("|", "\\|") + "`"


def render_failure_table() -> str:
    lines = ["| the reward function | e.g. | then |", "|---|---|---|"]
    lines += [f"| {case} | `{body}` | {outcome} |" for case, body, outcome in FAILURE_CASES]
    return "\n".join(lines)


def documented_table(begin: str = BEGIN, end: str = END) -> str:
    text = DOC.read_text(encoding="utf-8")
    return text.split(begin)[1].split(end)[0].strip() if begin in text else ""


def test_docs_table_matches_the_tests():
    assert documented_table() == render_case_table(), "regenerate: python -m tests.rewards.test_docs"


def test_docs_failure_table_matches_the_tests():
    """What a failing reward function leads to, as `test_safety.test_failure_case` asserts."""
    assert documented_table(FAILURES_BEGIN, FAILURES_END) == render_failure_table(), (
        "regenerate: python -m tests.rewards.test_docs")


def _replace_between(text: str, begin: str, end: str, table: str) -> str:
    head, rest = text.split(begin)
    return f"{head}{begin}\n{table}\n{end}{rest.split(end)[1]}"


if __name__ == "__main__":
    text = DOC.read_text(encoding="utf-8")
    text = _replace_between(text, BEGIN, END, render_case_table())
    text = _replace_between(text, FAILURES_BEGIN, FAILURES_END, render_failure_table())
    DOC.write_text(text, encoding="utf-8")
    print(f"updated {DOC}")
