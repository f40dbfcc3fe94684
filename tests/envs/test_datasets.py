"""load_prompts over every source format, skipped-row accounting, rendering and length limits."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rllib_grpo.envs._file_env import fixture_path
from rllib_grpo.envs.datasets import (
    PromptDataset,
    PromptRecord,
    apply_length_limit,
    encode_prompt,
    load_prompts,
    render_and_encode,
    render_prompt,
)
from tests.helpers.char_tokenizer import CharTokenizer

PLAIN_ROWS = [
    {"prompt": "1+1=", "answer": 2, "id": "a"},
    {"prompt": "2+2=", "answer": 4, "id": "b"},
]
VERL_ROW = {
    "data_source": "openai/gsm8k",
    "prompt": [{"role": "user", "content": "How many? Let's think."}],
    "ability": "math",
    "reward_model": {"style": "rule", "ground_truth": "72"},
    "extra_info": {"split": "train", "index": 7},
}


def write_jsonl(path, lines):
    path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines))
    return path


def test_plain_jsonl(tmp_path):
    dataset = load_prompts(write_jsonl(tmp_path / "p.jsonl", PLAIN_ROWS), data_source="arithmetic")
    assert [(r.prompt, r.ground_truth, r.data_source, r.index) for r in dataset] == [
        ("1+1=", 2, "arithmetic", 0),
        ("2+2=", 4, "arithmetic", 1),
    ]
    assert dataset[1].extra_info == {"id": "b"}  # unknown fields are kept
    assert dataset.skipped == {}


def test_verl_jsonl_is_read_as_is(tmp_path):
    record = load_prompts(write_jsonl(tmp_path / "v.jsonl", [VERL_ROW]))[0]
    assert record.prompt == VERL_ROW["prompt"]
    assert (record.ground_truth, record.data_source) == ("72", "openai/gsm8k")
    assert record.extra_info == {"ability": "math", "split": "train", "index": 7}


def test_shipped_fixture_is_verl_format():
    dataset = load_prompts(fixture_path("gsm8k_fixture.jsonl"))
    assert len(dataset) == 32 and dataset.skipped == {}
    assert dataset[0].ground_truth == "26" and dataset[0].prompt[0]["role"] == "user"


def test_parquet_matches_jsonl(tmp_path):
    rows = [VERL_ROW, {**VERL_ROW, "reward_model": {"style": "rule", "ground_truth": "5"}}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "v.parquet")
    from_parquet = load_prompts(tmp_path / "v.parquet")
    from_jsonl = load_prompts(write_jsonl(tmp_path / "v.jsonl", rows))
    assert list(from_parquet) == list(from_jsonl)


def test_json_list_file(tmp_path):
    (tmp_path / "p.json").write_text(json.dumps(PLAIN_ROWS))
    assert len(load_prompts(tmp_path / "p.json", data_source="arithmetic")) == 2


def test_list_of_dicts_and_passthrough():
    dataset = load_prompts(PLAIN_ROWS, data_source="arithmetic")
    assert len(dataset) == 2
    assert load_prompts(dataset) is dataset


class HFLikeDataset:
    """Duck-types ``datasets.Dataset``: iterating yields dict rows (numpy arrays inside)."""

    def __init__(self, rows):
        self._rows = rows

    def __len__(self):
        return len(self._rows)

    def __iter__(self):
        return iter(self._rows)


def test_hf_like_dataset_with_numpy_prompt():
    row = {**VERL_ROW, "prompt": np.array(VERL_ROW["prompt"], dtype=object)}
    dataset = load_prompts(HFLikeDataset([row, VERL_ROW]))
    assert dataset[0].prompt == dataset[1].prompt == VERL_ROW["prompt"]
    assert dataset.name == "HFLikeDataset"


def test_prompt_records_are_accepted_as_rows():
    records = [PromptRecord("1+1=", 2, "arithmetic", index=5), PromptRecord("2+2=", 4, "arithmetic")]
    assert [(r.prompt, r.index) for r in load_prompts(records)] == [("1+1=", 0), ("2+2=", 1)]


def test_custom_keys():
    dataset = load_prompts([{"question": "Q?", "solution": "#### 3"}], prompt_key="question",
                           answer_key="solution", data_source="gsm8k")  # fmt: skip
    assert (dataset[0].prompt, dataset[0].ground_truth) == ("Q?", "#### 3")


BAD_LINES = [
    json.dumps(PLAIN_ROWS[0]),                                   # row 1: good
    "{not json",                                                 # row 2
    json.dumps({"prompt": "3+3="}),                              # row 3: missing answer
    json.dumps({"prompt": "4+4="}),                              # row 4: missing answer
    json.dumps({"prompt": 5, "answer": 1}),                      # row 5: prompt not text
    json.dumps({"prompt": [{"role": "user"}], "answer": 1}),     # row 6: message without content
    json.dumps({"prompt": "  ", "answer": 1}),                   # row 7: empty prompt
    json.dumps([1, 2]),                                          # row 8: not an object
    json.dumps({**VERL_ROW, "reward_model": {"style": "rule"}}),  # row 9: no ground truth
    json.dumps({**VERL_ROW, "data_source": None}),               # row 10: no data_source
    "",                                                          # blank lines are not rows
    json.dumps(PLAIN_ROWS[1]),                                   # row 12: good
]  # fmt: skip


def test_bad_rows_are_skipped_and_counted_per_kind(tmp_path):
    dataset = load_prompts(write_jsonl(tmp_path / "bad.jsonl", BAD_LINES), data_source="arithmetic")
    assert dataset.skipped == {
        "invalid JSON": 1,
        "missing 'answer'": 2,
        "'prompt' is not a string or chat messages": 2,
        "empty 'prompt'": 1,
        "row is not an object": 1,
        "missing 'reward_model.ground_truth'": 1,
    }
    # rows 1, 10 (its data_source comes from the argument) and 12
    assert [r.ground_truth for r in dataset] == [2, "72", 4]
    report = dataset.report()
    assert "3 prompts, 8 rows skipped" in report
    assert "2 x missing 'answer': first at " in report and "line 3; " in report and "answer_key" in report


def test_rows_without_data_source_are_skipped_without_a_default():
    dataset = load_prompts(PLAIN_ROWS)
    assert len(dataset) == 0 and dataset.skipped == {"missing 'data_source'": 2}
    assert "data_source=" in dataset.report()


def test_strict_names_row_field_and_fix(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [BAD_LINES[0], BAD_LINES[2]])
    with pytest.raises(ValueError, match=r"line 2: missing 'answer'.*answer_key="):
        load_prompts(path, data_source="arithmetic", strict=True)


def test_strict_invalid_json(tmp_path):
    with pytest.raises(ValueError, match="line 1: invalid JSON"):
        load_prompts(write_jsonl(tmp_path / "b.jsonl", ["{"]), strict=True)


def test_file_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_prompts(tmp_path / "missing.jsonl")
    (tmp_path / "p.csv").write_text("prompt,answer\n")
    with pytest.raises(ValueError, match="unknown prompt file type"):
        load_prompts(tmp_path / "p.csv")
    with pytest.raises(TypeError):
        load_prompts({"prompt": "x"})


def test_render_prompt():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert render_prompt("3+4=") == "3+4="
    assert render_prompt(messages) == "Be brief.\n2+2?"
    assert render_prompt(messages, CharTokenizer(chat=False)) == "Be brief.\n2+2?"
    assert render_prompt(messages, CharTokenizer(chat=True)) == "<system>Be brief.<user>2+2?<assistant>"
    assert encode_prompt("ab", CharTokenizer()) == [97, 98]


class FlagRecordingTokenizer(CharTokenizer):
    def encode(self, text, add_special_tokens=True):
        self.flag = add_special_tokens
        return super().encode(text)


@pytest.mark.parametrize(("prompt", "chat", "flag"), [
    ("plain", True, True), ([{"role": "user", "content": "hi"}], False, True),
    ([{"role": "user", "content": "hi"}], True, False)])  # fmt: skip
def test_special_tokens_only_without_a_chat_template(prompt, chat, flag):
    tokenizer = FlagRecordingTokenizer(chat=chat)
    text, token_ids = render_and_encode(prompt, tokenizer)
    assert tokenizer.flag is flag and token_ids == [ord(c) for c in text]


TEN = list(range(10))


@pytest.mark.parametrize(
    ("limit", "mode", "expected"),
    [
        (4, "left", [6, 7, 8, 9]),
        (4, "right", [0, 1, 2, 3]),
        (4, "middle", [0, 1, 8, 9]),
        (5, "middle", [0, 1, 7, 8, 9]),
        (1, "middle", [9]),
        (10, "error", TEN),
        (None, "error", TEN),
    ],
)
def test_truncation_modes(limit, mode, expected):
    assert apply_length_limit(TEN, limit, mode) == expected


def test_truncation_error_names_limit_length_and_fixes():
    with pytest.raises(ValueError) as error:
        apply_length_limit(TEN, 4, "error")
    message = str(error.value)
    for part in ("10 tokens", "max_prompt_length=4", "truncation", "filter_overlong_prompts"):
        assert part in message


@pytest.mark.parametrize(("limit", "mode"), [(4, "bogus"), (0, "left")])
def test_truncation_bad_arguments(limit, mode):
    with pytest.raises(ValueError):
        apply_length_limit(TEN, limit, mode)


def test_filter_overlong_counts_and_renumbers():
    records = [PromptRecord("x" * n, n, "arithmetic") for n in (3, 8, 5, 9)]
    dataset = PromptDataset(records, name="lengths").filter_overlong(CharTokenizer(), 5)
    assert [r.ground_truth for r in dataset] == [3, 5]
    assert [r.index for r in dataset] == [0, 1]
    assert dataset.skipped == {"prompt longer than max_prompt_length=5 tokens": 2}


@pytest.mark.parametrize("batch_tokenizer", [True, False], ids=["fast-batch", "one-by-one"])
def test_prompt_token_lengths_are_each_prompt_s_own_encoding(batch_tokenizer):
    """Distinct prompts rendered once and encoded in batches (per special-token setting)
    count exactly what `encode_prompt` counts one by one: plain strings (special tokens
    added), chat messages through the template (none added), repeats, and a tokenizer
    that takes no batch."""
    from rllib_grpo.envs.datasets import encode_prompt, prompt_token_lengths
    from rllib_grpo.models import DEFAULT_ALPHABET, build_char_tokenizer

    if batch_tokenizer:
        tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
        tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                                   "{% endfor %}{% if add_generation_prompt %}= {% endif %}")
        assert tokenizer(["1+2"], add_special_tokens=True)["input_ids"]  # takes a batch
    else:
        tokenizer = FlagRecordingTokenizer(chat=True)
    chat = [{"role": "system", "content": "add"}, {"role": "user", "content": "12+3"}]
    prompts = ["1+2=", chat, "1+2=", [{"role": "user", "content": "7+8"}], chat, "40+2="]
    expected = [len(encode_prompt(prompt, tokenizer)) for prompt in prompts]
    assert prompt_token_lengths(prompts, tokenizer) == expected
    assert len(set(expected)) > 2  # the prompts differ in length: the check can fail
