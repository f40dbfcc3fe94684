"""Turn Hugging Face GSM8K / MATH rows into verl-format JSONL prompt files.

    python -m rllib_grpo.envs.prepare_data gsm8k --out gsm8k.jsonl [--split test]
    python -m rllib_grpo.envs.prepare_data math --out math.jsonl
    python -m rllib_grpo.envs.prepare_data gsm8k --from-file raw.jsonl --out gsm8k.jsonl

Downloads need the ``datasets`` package and access to the Hub; without them,
pass ``--from-file`` with the raw rows (``question``/``answer`` for GSM8K,
``problem``/``solution`` for MATH) as .jsonl, .json or .parquet. The output
rows match verl's ``examples/data_preprocess`` (same instructions and fields).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from rllib_grpo.rewards import extract_boxed, extract_gsm8k_answer

GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
MATH_INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
HUB_DATASETS = {  # name -> (hub id, config)
    "gsm8k": ("openai/gsm8k", "main"),
    "math": ("DigitalLearningGmbH/MATH-lighteval", None),
}


def convert_gsm8k_row(row: Mapping[str, Any], index: int, split: str = "train") -> dict:
    """A verl GSM8K row from an ``openai/gsm8k`` row (``question``, ``answer``)."""
    ground_truth = extract_gsm8k_answer(row["answer"])
    if ground_truth is None:
        raise ValueError(f"GSM8K row {index}: the answer has no '#### number'")
    return _verl_row(
        HUB_DATASETS["gsm8k"][0],
        f"{row['question']} {GSM8K_INSTRUCTION}",
        ground_truth,
        {"split": split, "index": index, "question": row["question"], "answer": row["answer"]},
    )


def convert_math_row(row: Mapping[str, Any], index: int, split: str = "train") -> dict:
    """A verl MATH row from a MATH-lighteval row (``problem``, ``solution``)."""
    ground_truth = extract_boxed(row["solution"])
    if ground_truth is None:
        raise ValueError(f"MATH row {index}: the solution has no \\boxed{{}} answer")
    extra_info = {
        "split": split,
        "index": index,
        "question": row["problem"],
        "solution": row["solution"],
    }
    extra_info.update({key: row[key] for key in ("level", "type") if key in row})
    return _verl_row(
        HUB_DATASETS["math"][0], f"{row['problem']} {MATH_INSTRUCTION}", ground_truth, extra_info
    )


def _verl_row(data_source: str, content: str, ground_truth: str, extra_info: dict) -> dict:
    return {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


CONVERTERS: dict[str, Callable[[Mapping[str, Any], int, str], dict]] = {
    "gsm8k": convert_gsm8k_row,
    "math": convert_math_row,
}


def load_hub_rows(name: str, split: str) -> Iterable[Mapping[str, Any]]:
    """Rows of the Hub dataset; SystemExit with what to do when it cannot be had."""
    hub_id, config = HUB_DATASETS[name]
    try:
        import datasets
    except ImportError:
        raise SystemExit(
            f"downloading {hub_id} needs the 'datasets' package (pip install datasets); "
            "or pass --from-file with a local copy of the raw rows"
        ) from None
    try:
        return datasets.load_dataset(hub_id, config, split=split)
    except Exception as err:  # noqa: BLE001 - any download failure gets the same advice
        raise SystemExit(
            f"could not load {hub_id} (split {split!r}) from the Hugging Face Hub: "
            f"{type(err).__name__}: {err}\nThe Hub may be unreachable from this machine. "
            "Run this command where it is reachable and copy the .jsonl over, or pass "
            "--from-file with the raw rows (.jsonl, .json or .parquet)."
        ) from None


def read_raw_rows(path: Path) -> list[Mapping[str, Any]]:
    """Raw dataset rows from a local .jsonl, .json or .parquet file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json":
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def convert_rows(
    name: str, rows: Iterable[Mapping[str, Any]], split: str
) -> tuple[list[dict], int]:
    """Converted rows and the number of rows that could not be converted."""
    converted, failed = [], 0
    for index, row in enumerate(rows):
        try:
            converted.append(CONVERTERS[name](row, index, split))
        except (KeyError, TypeError, ValueError):
            failed += 1
    return converted, failed


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dataset", choices=sorted(CONVERTERS))
    parser.add_argument("--out", required=True, type=Path, help="output .jsonl path")
    parser.add_argument("--split", default="train")
    parser.add_argument("--from-file", type=Path, help="raw rows instead of the Hub")
    parser.add_argument("--limit", type=int, help="convert at most this many rows")
    args = parser.parse_args(argv)
    rows = (
        read_raw_rows(args.from_file) if args.from_file else load_hub_rows(args.dataset, args.split)
    )
    rows = list(rows)[: args.limit] if args.limit else rows
    converted, failed = convert_rows(args.dataset, rows, args.split)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", encoding="utf-8") as out:
        out.writelines(json.dumps(row, ensure_ascii=False) + "\n" for row in converted)
    print(f"wrote {len(converted)} rows to {args.out} ({failed} rows could not be converted)")
    return 0 if converted else 1


if __name__ == "__main__":
    sys.exit(main())
