"""Prompts with images: verl's Geo3K parquet schema read back as written, JSONL with image
paths, malformed or missing images counted and skipped (or refused with ``strict``), and
``<image>`` placeholders turned into chat image parts (`rllib_grpo.data.images`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rllib_grpo.data.images import image_messages
from rllib_grpo.envs.datasets import load_prompts
from tests.helpers.images import geo3k_rows, png_bytes, write_geo3k_parquet


def test_geo3k_parquet_round_trip(tmp_path):
    import pyarrow.parquet as pq

    path = write_geo3k_parquet(tmp_path / "train.parquet", n=3)
    schema = pq.read_schema(path)
    assert str(schema.field("images").type) == "list<element: struct<bytes: binary, path: null>>"
    dataset = load_prompts(path)
    assert len(dataset) == 3 and not dataset.skipped and dataset.has_images
    for index, record in enumerate(dataset):
        assert record.prompt == geo3k_rows(3)[index]["prompt"]
        assert record.ground_truth == str(index + 2)
        assert record.data_source == "hiyouga/geometry3k"
        assert record.extra_info == {"ability": "math", "split": "train", "index": index,
                                     "answer": str(index + 2),
                                     "question": f"<image>Find x. Side {index + 2}."}
        (image,) = record.images
        assert image.mode == "RGB" and image.size == (40, 30)
        assert np.asarray(image)[0, 0].tolist() == [10 * index, 100, 200]


def test_jsonl_rows_name_image_files_relative_to_the_file(tmp_path):
    (tmp_path / "figs").mkdir()
    (tmp_path / "figs" / "a.png").write_bytes(png_bytes((1, 2, 3)))
    rows = [{"prompt": "<image> and <image>: same colour?", "answer": "yes",
             "pictures": ["figs/a.png", str(tmp_path / "figs" / "a.png")]}]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (record,) = load_prompts(path, image_key="pictures", data_source="x")
    assert [np.asarray(i)[0, 0].tolist() for i in record.images] == [[1, 2, 3]] * 2
    assert "pictures" not in record.extra_info
    assert not load_prompts(path, data_source="x")[0].images  # default key: no such column


def test_a_malformed_or_missing_image_is_counted_and_skipped(tmp_path):
    rows = geo3k_rows(5)
    rows[1]["images"] = [{"bytes": png_bytes((0, 0, 0))[:40], "path": None}]  # truncated
    rows[3]["images"] = [{"bytes": None, "path": str(tmp_path / "gone.png")}]
    rows[4]["images"] = [{"bytes": b"not an image at all", "path": None}]
    path = write_geo3k_parquet(tmp_path / "train.parquet", rows=rows)
    dataset = load_prompts(path)
    assert [r.ground_truth for r in dataset] == ["2", "4"]
    assert dataset.skipped == {"malformed image": 2, "missing image file": 1}
    assert "first at" in dataset.skip_reasons["malformed image"]
    assert dataset.skipped_metrics()["data/skipped/malformed_image"] == 2
    with pytest.raises(ValueError, match=r"train.parquet row 2: malformed image"):
        load_prompts(path, strict=True)


def test_placeholders_must_match_the_images(tmp_path):
    rows = geo3k_rows(2)
    rows[0]["images"] = rows[0]["images"] * 2  # one <image>, two images
    dataset = load_prompts(write_geo3k_parquet(tmp_path / "t.parquet", rows=rows))
    assert len(dataset) == 1 and dataset.skipped == {
        "image placeholders do not match images": 1}


def test_placeholders_become_image_parts():
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": "<image>Find x.<image> Why?"}]
    assert image_messages(messages, 2) == [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "Find x."},
                                     {"type": "image"}, {"type": "text", "text": " Why?"}]}]
    # No placeholder: the images go first in the first user message.
    assert image_messages("How many?", 1) == [
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
