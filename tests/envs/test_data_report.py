"""No silent drops: every dropped row is counted by kind, logged and exported as a metric;
strict mode names the file and line; non-UTF-8 lines are bad rows; over-long prompts are
refused at load with truncation='error'."""

from __future__ import annotations

import json
import logging

import pytest

from rllib_grpo.envs.datasets import load_prompts
from rllib_grpo.envs.text import TextEnv
from tests.conftest import tiny_config

GOOD = [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "data_source": "arithmetic"}
        for a in range(1, 9)]


def _write(path, lines: list[bytes]):
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _mixed_file(tmp_path):
    """Lines 1-8 good, 9 invalid JSON, 10 missing the answer, 11 not UTF-8."""
    lines = [json.dumps(row).encode() for row in GOOD]
    lines += [b"{not json", json.dumps({"prompt": "3+3=", "data_source": "arithmetic"}).encode(),
              b'{"prompt": "caf\xe9", "answer": 1}']
    return _write(tmp_path / "train.jsonl", lines)


def test_dropped_rows_are_logged_and_counted_as_metrics(tmp_path, caplog):
    path = _mixed_file(tmp_path)
    with caplog.at_level(logging.WARNING, logger="rllib_grpo.envs.datasets"):
        env = TextEnv(str(path))
    assert env.num_prompts == 8
    assert env.dataset.skipped == {"invalid JSON": 1, "missing 'answer'": 1, "not UTF-8": 1}
    assert env.dataset.skipped_metrics() == {
        "data/skipped/total": 3, "data/skipped/invalid_json": 1,
        "data/skipped/missing_answer": 1, "data/skipped/not_utf_8": 1}
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "8 prompts, 3 rows skipped" in logged
    assert f"first at {path} line 11; byte 15 of the line is not UTF-8" in logged
    assert f"first at {path} line 9" in logged


def test_strict_refuses_any_dropped_row_naming_file_and_line(tmp_path):
    path = _mixed_file(tmp_path)
    with pytest.raises(ValueError, match=rf"{path} line 9: invalid JSON"):
        load_prompts(path, strict=True)
    lines = path.read_bytes().splitlines()
    _write(path, lines[:8] + lines[10:])
    with pytest.raises(ValueError, match=rf"{path} line 9: not UTF-8; byte 15"):
        load_prompts(path, strict=True)


def test_a_json_file_with_a_non_utf8_byte_names_the_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(b'[\n {"prompt": "1+1=", "answer": 2},\n {"prompt": "\xff"}\n]')
    with pytest.raises(ValueError, match=rf"{path} line 3: not UTF-8 text"):
        load_prompts(path, data_source="arithmetic")


class _Chars:
    """One token per character."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) for c in text]

    def decode(self, ids, **kwargs):
        return "".join(map(chr, ids))


def test_truncation_error_checks_every_prompt_at_load(tmp_path):
    rows = [json.dumps(r).encode() for r in GOOD]
    rows[5] = json.dumps({**GOOD[5], "prompt": "1" * 40 + "="}).encode()
    rows[6] = json.dumps({**GOOD[6], "prompt": "2" * 40 + "="}).encode()
    path = _write(tmp_path / "long.jsonl", rows)
    with pytest.raises(ValueError, match=rf"{path} line 6: prompt is 41 tokens, longer than "
                                         r"max_prompt_length=16 \(and 1 more prompts\)"):
        TextEnv(str(path), tokenizer=_Chars(), max_prompt_length=16, truncation="error")
    env = TextEnv(str(path), tokenizer=_Chars(), max_prompt_length=16, truncation="left")
    assert env.num_prompts == 8  # the other modes still truncate when drawn


@pytest.mark.slow
def test_the_run_exports_data_skipped_metrics(ray_session, tmp_path):
    from rllib_grpo.cli.tensorboard import flatten

    config = tiny_config(truncation="left")
    config.environment("rllib_grpo/GSM8K-v0")
    config.env_config = {"path": str(_mixed_file(tmp_path)), "data_source": "arithmetic"}
    algo = config.build_algo()
    try:
        result = flatten(algo.train())
    finally:
        algo.stop()
    assert result["env_runners/data/skipped/total"] == 3
    assert result["env_runners/data/skipped/invalid_json"] == 1
    assert result["env_runners/data/skipped/not_utf_8"] == 1
