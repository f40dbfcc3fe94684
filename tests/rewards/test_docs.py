"""docs/rewards.md's case table is generated from the reward tests' case tables.

After changing a case table, regenerate it with ``python -m tests.rewards.test_docs``.
"""

import json

from tests.conftest import REPO_ROOT
from tests.rewards.test_arith_countdown import ARITHMETIC_CASES, COUNTDOWN_CASES
from tests.rewards.test_gsm8k import GSM8K_CASES
from tests.rewards.test_math import MATH_CASES
from tests.rewards.test_math_dapo import MATH_DAPO_CASES

DOC = REPO_ROOT / "docs" / "rewards.md"
BEGIN, END = "<!-- cases:begin -->", "<!-- cases:end -->"
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


def documented_table() -> str:
    return DOC.read_text(encoding="utf-8").split(BEGIN)[1].split(END)[0].strip()


def test_docs_table_matches_the_tests():
    assert documented_table() == render_case_table(), "regenerate: python -m tests.rewards.test_docs"


if __name__ == "__main__":
    head, rest = DOC.read_text(encoding="utf-8").split(BEGIN)
    tail = rest.split(END)[1]
    DOC.write_text(f"{head}{BEGIN}\n{render_case_table()}\n{END}{tail}", encoding="utf-8")
    print(f"updated {DOC}")
