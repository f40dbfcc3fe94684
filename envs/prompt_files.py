"""Reading prompt files (JSONL, JSON, Parquet) into numbered rows, and a cheap check that a
file can be read at all (`prompt_file_error`, run before anything starts).

A JSONL line that is not UTF-8 or not JSON comes out as a `RowError` row, so the loader
counts it (or, with ``strict``, refuses it naming the file and line).  No Ray, no torch.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


class RowError(ValueError):
    """A malformed row: ``kind`` is the count key, ``fix`` says what to do."""

    def __init__(self, kind: str, fix: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.fix = fix


def read_rows(source: Any, fmt: str) -> tuple[str, Iterable[tuple[int, Any]]]:
    """``(name, (1-based row number, row) pairs)`` from a file path or an iterable of rows;
    bad JSONL lines come as `RowError` rows."""
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        return str(path), _read_file(path, fmt)
    if isinstance(source, Mapping) or not isinstance(source, Iterable):
        raise TypeError(
            f"source must be a file path, an iterable of dict rows or a PromptDataset, "
            f"got {type(source).__name__}"
        )
    return type(source).__name__, enumerate(source, start=1)


def _read_file(path: Path, fmt: str) -> Iterable[tuple[int, Any]]:
    file_format = _file_format(path) if fmt == "auto" else fmt
    if file_format == "jsonl":
        return _read_jsonl(path)
    if file_format == "json":
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            line = raw[:err.start].count(b"\n") + 1
            raise ValueError(f"{path} line {line}: not UTF-8 text (byte {err.start}); "
                             "re-encode the file as UTF-8") from None
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ValueError(f"{path}: a .json prompt file must hold a list of rows")
        return enumerate(rows, start=1)
    if file_format == "parquet":
        import pyarrow.parquet as pq

        return enumerate(pq.read_table(path).to_pylist(), start=1)
    raise ValueError(f"fmt must be 'auto', 'jsonl', 'json' or 'parquet', got {fmt!r}")


PROMPT_FILE_SUFFIXES = (".jsonl", ".ndjson", ".json", ".parquet")
_PROBE_BYTES = 1 << 20


def prompt_file_error(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a prompt file at all, or None.  Cheap: the file
    exists, its type is known and its start decodes (the first row of a JSONL file is one
    UTF-8 JSON object; a JSON file starts as UTF-8 text holding a list; a Parquet file has
    a readable schema).  Bad rows further in are counted, or refused with ``strict``, when
    the data loads."""
    path = Path(path)
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    if path.suffix not in PROMPT_FILE_SUFFIXES:
        return f"{path}: unknown prompt file type; use {', '.join(PROMPT_FILE_SUFFIXES)}"
    try:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            rows = pq.read_metadata(path).num_rows  # the schema is read with it
            return None if rows else f"{path}: no rows (an empty dataset)"
        with path.open("rb") as f:
            head = f.read(_PROBE_BYTES)
    except Exception as err:  # noqa: BLE001  (pyarrow's and the OS's errors: say which)
        return f"{path}: unreadable ({type(err).__name__}: {err})"
    if path.suffix == ".json":
        return _json_head_error(path, head)
    return _jsonl_head_error(path, head, complete=len(head) < _PROBE_BYTES)


def _jsonl_head_error(path: Path, head: bytes, complete: bool) -> str | None:
    """The first non-empty line must be UTF-8 and one JSON value (unless the probe cut it)."""
    for number, raw in enumerate(head.splitlines(keepends=True), start=1):
        cut = not raw.endswith(b"\n") and not complete
        try:
            line = codecs.getincrementaldecoder("utf-8")().decode(raw, final=not cut)
        except UnicodeDecodeError as err:
            return (f"{path} line {number}: not UTF-8 text (byte {err.start}); re-encode it "
                    "as UTF-8")
        if not line.strip():
            continue
        try:
            json.loads(line)
        except json.JSONDecodeError as err:
            return None if cut else f"{path} line {number}: invalid JSON ({err.msg})"
        return None
    return f"{path}: no rows (empty file)" if complete else None


def _json_head_error(path: Path, head: bytes) -> str | None:
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as err:
        line = head[:err.start].count(b"\n") + 1
        return f"{path} line {line}: not UTF-8 text (byte {err.start}); re-encode it as UTF-8"
    if not text.lstrip().startswith("["):
        return f"{path}: a .json prompt file must hold a list of rows"
    return None


def _file_format(path: Path) -> str:
    suffixes = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet"}
    if path.suffix not in suffixes:
        raise ValueError(
            f"{path}: unknown prompt file type; use .jsonl, .json or .parquet or pass fmt="
        )
    return suffixes[path.suffix]


def is_jsonl(path: Path, fmt: str) -> bool:
    return fmt == "jsonl" or (fmt == "auto" and path.suffix in (".jsonl", ".ndjson"))


def _read_jsonl(path: Path) -> Iterable[tuple[int, Any]]:
    with path.open("rb") as lines:
        for line_number, raw in enumerate(lines, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield line_number, RowError(
                    "not UTF-8", f"byte {err.start} of the line is not UTF-8; re-encode the "
                    "file as UTF-8")
                continue
            if not line.strip():
                continue
            try:
                yield line_number, json.loads(line)
            except json.JSONDecodeError:
                yield line_number, RowError("invalid JSON", "each line must be one JSON object")
