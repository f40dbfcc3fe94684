"""A small geometry3k-style parquet file with images (vision datasets)."""

from __future__ import annotations

import io

INSTRUCTION = ("You FIRST think about the reasoning process as an internal monologue and then "
               "provide the final answer. The reasoning process MUST BE enclosed within <think> "
               "</think> tags. The final answer MUST BE put in \\boxed{}.")


def png_bytes(colour: tuple[int, int, int], size: tuple[int, int] = (40, 30)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def geo3k_rows(n: int, split: str = "train") -> list[dict]:
    """Rows as verl's examples/data_preprocess/geo3k.py writes them (its ``process_fn``):
    the figure as datasets' Image struct, the problem with its leading ``<image>``."""
    rows = []
    for index in range(n):
        problem = f"<image>Find x. Side {index + 2}."
        rows.append({
            "data_source": "hiyouga/geometry3k",
            "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
            "images": [{"bytes": png_bytes((10 * index, 100, 200)), "path": None}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(index + 2)},
            "extra_info": {"split": split, "index": index, "answer": str(index + 2),
                           "question": problem},
        })
    return rows


def write_geo3k_parquet(path, n: int = 4, split: str = "train", rows: list[dict] | None = None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows if rows is not None else geo3k_rows(n, split)),
                   path)
    return path
