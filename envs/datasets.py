"""Prompt datasets: loading verl-format and plain rows, rendering and length limits.

Row formats (detected per row):

* verl: ``{"data_source", "prompt": [{"role", "content"}, ...],
  "reward_model": {"ground_truth", "style"}, "extra_info": {...}}``
* plain: ``{"prompt": "question text", "answer": ..., "data_source"?: ...}``
  (field names set by ``prompt_key``/``answer_key``; other fields go to ``extra_info``).

Either may carry images (verl's ``data.image_key`` column, ``images`` by default, with
``<image>`` placeholders in the prompt): decoded once here (`rllib_grpo.data.images`).

Malformed rows (invalid JSON, non-UTF-8 bytes, missing fields, ...) are skipped and
counted per kind (``dataset.skipped``, ``dataset.report()``, ``dataset.skipped_metrics()``),
or raise with ``strict=True`` naming the file and line. No Ray, no torch.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rllib_grpo.data.images import DEFAULT_IMAGE_KEY, check_placeholders, decode_row_images
from rllib_grpo.envs.prompt_files import RowError, is_jsonl, read_rows

logger = logging.getLogger(__name__)

TRUNCATION_MODES = ("error", "left", "right", "middle")
SKIPPED_METRIC_PREFIX = "data/skipped/"

Prompt = str | list[dict]


@dataclasses.dataclass(frozen=True)
class PromptRecord:
    """One prompt with what scoring it needs.

    ``index`` is the record's position in its :class:`PromptDataset`; a verl
    row's own ``extra_info["index"]`` is kept in ``extra_info``.  ``origin`` says where
    the row came from (``"train.jsonl line 18"``), for error messages.  ``images``: the
    row's decoded RGB images (PIL), in the order of the prompt's ``<image>`` placeholders.
    """

    prompt: Prompt
    ground_truth: Any
    data_source: str
    extra_info: dict = dataclasses.field(default_factory=dict)
    index: int = 0
    origin: str = dataclasses.field(default="", compare=False)
    images: tuple = ()

    def where(self) -> str:
        """Where the record came from, or its index."""
        return self.origin or f"prompt {self.index}"


class PromptDataset(Sequence[PromptRecord]):
    """A sequence of :class:`PromptRecord` plus counts of the rows that were dropped.

    ``skipped`` maps a kind (``"missing 'answer'"``) to a count; ``skip_reasons``
    maps the kind to one line: where it first happened and how to fix it.
    """

    def __init__(
        self,
        records: Iterable[PromptRecord],
        *,
        skipped: Mapping[str, int] | None = None,
        skip_reasons: Mapping[str, str] | None = None,
        name: str = "prompts",
    ) -> None:
        self.records = [dataclasses.replace(r, index=i) for i, r in enumerate(records)]
        self.skipped: dict[str, int] = dict(skipped or {})
        self.skip_reasons: dict[str, str] = dict(skip_reasons or {})
        self.name = name

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, index):  # int or slice, as for any Sequence
        return self.records[index]

    def __repr__(self) -> str:
        return f"PromptDataset({self.name!r}, {len(self)} records, skipped={self.skipped})"

    def report(self) -> str:
        """One line per skipped kind (count, first occurrence, fix), or that none were."""
        if not self.skipped:
            return f"{self.name}: {len(self)} prompts, no rows skipped"
        lines = [f"{self.name}: {len(self)} prompts, {sum(self.skipped.values())} rows skipped"]
        for kind, count in self.skipped.items():
            lines.append(f"  {count} x {kind}: {self.skip_reasons.get(kind, '')}")
        return "\n".join(lines)

    def skipped_metrics(self) -> dict[str, int]:
        """``{"data/skipped/total": n, "data/skipped/<kind>": n, ...}`` for the run's metrics."""
        metrics = {SKIPPED_METRIC_PREFIX + "total": sum(self.skipped.values())}
        for kind, count in self.skipped.items():
            key = SKIPPED_METRIC_PREFIX + skipped_kind_key(kind)
            metrics[key] = metrics.get(key, 0) + count
        return metrics

    def log_report(self) -> None:
        """Log `report`: a warning when rows were dropped, else at info level."""
        if self.skipped:
            logger.warning("%s", self.report())
        else:
            logger.info("%s", self.report())

    @property
    def has_images(self) -> bool:
        """Whether any prompt carries images."""
        return any(record.images for record in self.records)

    def filter(self, keep: Callable[[PromptRecord], bool], kind: str, reason: str) -> PromptDataset:
        """A new dataset without the records ``keep`` rejects, counted under ``kind``."""
        kept = [record for record in self.records if keep(record)]
        skipped = Counter(self.skipped)
        reasons = dict(self.skip_reasons)
        if len(kept) < len(self):
            skipped[kind] += len(self) - len(kept)
            reasons.setdefault(kind, reason)
        return PromptDataset(kept, skipped=skipped, skip_reasons=reasons, name=self.name)

    def filter_overlong(self, tokenizer: Any, max_prompt_length: int,
                        lengths: Sequence[int] | None = None) -> PromptDataset:
        """Drop prompts whose rendered token count exceeds ``max_prompt_length`` (verl's
        ``filter_overlong_prompts``); ``lengths``: every prompt's count where the caller
        measured them (image tokens included), else the tokenizer's."""
        if lengths is None:
            lengths = prompt_token_lengths([record.prompt for record in self.records], tokenizer)
        by_record = dict(zip(map(id, self.records), lengths, strict=True))
        return self.filter(
            lambda record: by_record[id(record)] <= max_prompt_length,
            f"prompt longer than max_prompt_length={max_prompt_length} tokens",
            "dropped by filter_overlong_prompts; raise max_prompt_length to keep them",
        )


def skipped_kind_key(kind: str) -> str:
    """A metric name for a kind of dropped row: ``"missing 'answer'"`` -> ``missing_answer``."""
    return re.sub(r"[^a-z0-9]+", "_", kind.lower().split("=")[0]).strip("_") or "other"


def load_prompts(
    source: str | os.PathLike | Iterable[Mapping[str, Any]] | PromptDataset,
    *,
    fmt: str = "auto",
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    data_source: str | None = None,
    strict: bool = False,
    image_key: str = DEFAULT_IMAGE_KEY,
) -> PromptDataset:
    """Load prompts from a file, a list of dict rows or a Hugging Face-like dataset.

    Args:
        source: a ``.jsonl``/``.json``/``.parquet`` path, an iterable of dict rows
            (a ``datasets.Dataset`` iterates as such) or of PromptRecords, or a
            PromptDataset (returned as is).
        fmt: file format, ``"auto"`` (by suffix), ``"jsonl"``, ``"json"`` or ``"parquet"``.
        prompt_key: field holding the prompt (a string or chat messages).
        answer_key: field holding the ground truth in plain rows (verl rows use
            ``reward_model.ground_truth``).
        data_source: for rows without a ``data_source`` field.
        strict: raise ValueError on the first malformed row (naming the file, the
            line (row for other formats), the field and the fix) instead of skipping
            and counting it.
        image_key: the field holding a row's images (verl's ``data.image_key``); a row
            whose image does not decode is malformed (`rllib_grpo.data.images`).
    """
    if isinstance(source, PromptDataset):
        return source
    name, rows = read_rows(source, fmt)
    base_dir = Path(source).parent if isinstance(source, str | os.PathLike) else None
    unit = "line" if isinstance(source, str | os.PathLike) and is_jsonl(Path(source), fmt) else (
        "row")
    records: list[PromptRecord] = []
    skipped: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for row_number, row in rows:
        where = f"{name} {unit} {row_number}"
        try:
            record = _record_from_row(row, prompt_key, answer_key, data_source, image_key,
                                      base_dir)
            records.append(record if record.origin else dataclasses.replace(record, origin=where))
        except RowError as err:
            if strict:
                raise ValueError(f"{where}: {err.kind}; {err.fix}") from None
            skipped[err.kind] += 1
            reasons.setdefault(err.kind, f"first at {where}; {err.fix}")
    return PromptDataset(records, skipped=skipped, skip_reasons=reasons, name=name)


def _record_from_row(
    row: Any, prompt_key: str, answer_key: str, default_data_source: str | None,
    image_key: str = DEFAULT_IMAGE_KEY, base_dir: Path | None = None,
) -> PromptRecord:
    if isinstance(row, RowError):
        raise row
    if isinstance(row, PromptRecord):
        return row
    if not isinstance(row, Mapping):
        raise RowError("row is not an object", "each row must be a JSON object / dict")
    prompt = _prompt_from_row(row, prompt_key)
    ground_truth = _ground_truth_from_row(row, answer_key)
    data_source = row.get("data_source") or default_data_source
    if not isinstance(data_source, str):
        raise RowError(
            "missing 'data_source'", "add it to the row or pass data_source=... to load_prompts"
        )
    extra_info = row.get("extra_info") or {}
    if not isinstance(extra_info, Mapping):
        raise RowError("'extra_info' is not an object", "make 'extra_info' a dict or drop it")
    images = decode_row_images(row.get(image_key), base_dir)
    if images:
        check_placeholders(prompt, len(images))
    consumed = {prompt_key, answer_key, "data_source", "reward_model", "extra_info", image_key}
    leftovers = {key: value for key, value in row.items() if key not in consumed}
    return PromptRecord(prompt, ground_truth, data_source, {**leftovers, **extra_info},
                        images=images)


def _prompt_from_row(row: Mapping, prompt_key: str) -> Prompt:
    if prompt_key not in row or row[prompt_key] is None:
        raise RowError(
            f"missing '{prompt_key}'", f"add a '{prompt_key}' field or pass prompt_key=..."
        )
    prompt = row[prompt_key]
    if hasattr(prompt, "tolist"):  # numpy arrays from pandas-read parquet
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        if not prompt.strip():
            raise RowError(f"empty '{prompt_key}'", "drop the row or give it a prompt")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_chat_message(m) for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise RowError(
        f"'{prompt_key}' is not a string or chat messages",
        'use a string or a non-empty list of {"role": str, "content": str}',
    )


def _is_chat_message(message: Any) -> bool:
    return (
        isinstance(message, Mapping)
        and isinstance(message.get("role"), str)
        and isinstance(message.get("content"), str)
    )


def _ground_truth_from_row(row: Mapping, answer_key: str) -> Any:
    reward_model = row.get("reward_model")
    if reward_model is not None:  # verl row
        if not isinstance(reward_model, Mapping) or reward_model.get("ground_truth") is None:
            raise RowError(
                "missing 'reward_model.ground_truth'",
                'verl rows need "reward_model": {"ground_truth": ..., "style": "rule"}',
            )
        return reward_model["ground_truth"]
    if row.get(answer_key) is None:
        raise RowError(
            f"missing '{answer_key}'",
            f"add '{answer_key}' (plain rows) or reward_model.ground_truth (verl rows), "
            "or pass answer_key=...",
        )
    return row[answer_key]


def uses_chat_template(prompt: Prompt, tokenizer: Any) -> bool:
    """True when ``prompt`` is chat messages and ``tokenizer`` has a chat template."""
    return (
        not isinstance(prompt, str)
        and tokenizer is not None
        and bool(getattr(tokenizer, "chat_template", None))
    )


def render_prompt(prompt: Prompt, tokenizer: Any = None) -> str:
    """Prompt text for the policy.

    Strings pass through. Chat messages go through the tokenizer's chat template
    (``add_generation_prompt=True``) when it has one, else their contents are
    joined with newlines.
    """
    if isinstance(prompt, str):
        return prompt
    if uses_chat_template(prompt, tokenizer):
        return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return "\n".join(message["content"] for message in prompt)


def render_and_encode(prompt: Prompt, tokenizer: Any) -> tuple[str, list[int]]:
    """Rendered text and its token ids.

    Special tokens (e.g. BOS) are added as ``tokenizer.encode`` adds them by
    default, except after a chat template, which writes its own.
    """
    text = render_prompt(prompt, tokenizer)
    add_special_tokens = not uses_chat_template(prompt, tokenizer)
    try:
        token_ids = tokenizer.encode(text, add_special_tokens=add_special_tokens)
    except TypeError:  # tokenizers without that keyword (e.g. simple character tokenizers)
        token_ids = tokenizer.encode(text)
    return text, list(token_ids)


def encode_prompt(prompt: Prompt, tokenizer: Any) -> list[int]:
    """Token ids of the rendered prompt (see :func:`render_and_encode`)."""
    return render_and_encode(prompt, tokenizer)[1]


def prompt_token_lengths(prompts: Sequence[Prompt], tokenizer: Any) -> list[int]:
    """``len(encode_prompt(prompt, tokenizer))`` of every prompt: each distinct prompt
    rendered once, the texts encoded in one batch call per special-token setting where
    the tokenizer takes a list (a fast tokenizer encodes a batch in Rust): a run checks
    every prompt twice (the config's check and the env's), and one by one that is seconds
    for a large dataset."""
    distinct: dict[Any, int] = {}
    keys = [_prompt_key(prompt) for prompt in prompts]
    firsts = [distinct.setdefault(key, index) for index, key in enumerate(keys)]
    by_flag: dict[bool, list[int]] = {}
    texts: dict[int, str] = {}
    for index in sorted(set(firsts)):
        texts[index] = render_prompt(prompts[index], tokenizer)
        by_flag.setdefault(not uses_chat_template(prompts[index], tokenizer), []).append(index)
    lengths: dict[int, int] = {}
    for add_special_tokens, indices in by_flag.items():
        batch = [texts[i] for i in indices]
        try:
            ids = tokenizer(batch, add_special_tokens=add_special_tokens)["input_ids"]
        except (TypeError, KeyError, ValueError, AttributeError):  # no batch call: one by one
            ids = [encode_prompt(prompts[i], tokenizer) for i in indices]
        lengths.update(zip(indices, map(len, ids), strict=True))
    return [lengths[first] for first in firsts]


def _prompt_key(prompt: Prompt) -> Any:
    """A hashable copy of a prompt (a string, or chat messages as nested tuples)."""
    if isinstance(prompt, str):
        return prompt
    return tuple(tuple(sorted((k, repr(v)) for k, v in message.items())) for message in prompt)


def apply_length_limit(
    token_ids: Sequence[int], max_prompt_length: int | None, truncation: str = "error"
) -> list[int]:
    """Enforce ``max_prompt_length`` the way verl's ``data.truncation`` does.

    ``error`` raises; ``left`` keeps the last tokens; ``right`` keeps the first;
    ``middle`` keeps the first ``max // 2`` and the last ``max - max // 2``.
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
    if max_prompt_length is not None and max_prompt_length < 1:
        raise ValueError(f"max_prompt_length must be at least 1, got {max_prompt_length}")
    token_ids = list(token_ids)
    if max_prompt_length is None or len(token_ids) <= max_prompt_length:
        return token_ids
    if truncation == "error":
        raise ValueError(
            f"prompt is {len(token_ids)} tokens, longer than max_prompt_length="
            f"{max_prompt_length}; raise max_prompt_length, set truncation to "
            "'left', 'right' or 'middle', or set filter_overlong_prompts=True"
        )
    if truncation == "left":
        return token_ids[-max_prompt_length:]
    if truncation == "right":
        return token_ids[:max_prompt_length]
    head = max_prompt_length // 2
    tail = max_prompt_length - head
    return token_ids[:head] + token_ids[-tail:]
