"""The door measures every prompt (issue 29): a prompt longer than ``max_prompt_length``
under ``truncation="error"`` is refused by `GRPOConfig.validate`, `explain` and
`rllib train` before Ray starts (it was found only when an env runner loaded the data), and
`explain` states what the other truncation settings do to the data."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_config

# builtin:tiny's character tokenizer: one token per character, nothing added.
PROMPTS = ["1+1=", "12+34+56=", "2+2=", "123+456+789="]  # 4, 9, 4, 12 tokens


def _file_config(tmp_path, prompts=PROMPTS, **training):
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "answer": "0", "data_source": "x"}) + "\n"
                            for p in prompts))
    config = tiny_config(**training).environment("rllib_grpo/Prompts-v0")
    config.env_config = {"path": str(data)}  # environment() would merge Arithmetic's options
    return config


def _length_errors(config) -> list[str]:
    from rllib_grpo.rllib.config.checks import find_errors

    return [e for e in find_errors(config) if "max_prompt_length" in e]


def test_an_overlong_prompt_is_refused_with_count_first_row_and_fixes(tmp_path):
    config = _file_config(tmp_path, max_prompt_length=8)
    expected = ("env_config: 2 of 4 prompts are longer than max_prompt_length=8 tokens "
                f"(truncation='error'); the first is {tmp_path / 'train.jsonl'} line 2 (prompt 1), "
                "9 tokens. "
                "Raise max_prompt_length (to 12 keeps all), set truncation='left', 'right' or "
                "'middle', or set filter_overlong_prompts=True.")
    assert _length_errors(config) == [expected]
    with pytest.raises(ValueError, match="2 of 4 prompts are longer than max_prompt_length=8"):
        config.validate()
    assert f"  - {expected}" in config.explain().splitlines()


def test_prompts_that_fit_pass_and_explain_says_so(tmp_path):
    config = _file_config(tmp_path, max_prompt_length=12)
    assert _length_errors(config) == []
    assert ("prompt lengths:                env_config: 4 prompts, longest 12 tokens; all fit "
            "max_prompt_length=12") in config.explain().splitlines()


@pytest.mark.parametrize("truncation, effect", [
    ("left", "are cut to their last 8 tokens (truncation='left')"),
    ("right", "are cut to their first 8 tokens (truncation='right')"),
    ("middle", "are cut to their first and last 8 tokens (truncation='middle')"),
])
def test_explain_states_how_many_prompts_truncation_cuts(tmp_path, truncation, effect):
    config = _file_config(tmp_path, max_prompt_length=8, truncation=truncation)
    assert _length_errors(config) == []
    assert (f"prompt lengths:                env_config: 4 prompts, longest 12 tokens; 2 longer "
            f"than max_prompt_length=8 {effect}") in config.explain().splitlines()


def test_explain_states_how_many_prompts_the_filter_drops(tmp_path):
    config = _file_config(tmp_path, max_prompt_length=8, filter_overlong_prompts=True)
    assert _length_errors(config) == []
    assert ("prompt lengths:                env_config: 4 prompts, longest 12 tokens; 2 longer "
            "than max_prompt_length=8 are dropped (filter_overlong_prompts), 2 stay"
            ) in config.explain().splitlines()
    config = _file_config(tmp_path, max_prompt_length=3, filter_overlong_prompts=True)
    assert _length_errors(config) == [
        "env_config: filter_overlong_prompts drops all 4 prompts (the shortest is 4 tokens, "
        "max_prompt_length=3); raise max_prompt_length."]


def test_generated_prompts_are_measured_too():
    errors = _length_errors(tiny_config(max_prompt_length=3))  # Arithmetic: "a+b=", 4 tokens
    assert len(errors) == 1 and errors[0].startswith(
        "env_config: 10000 of 10000 prompts are longer than max_prompt_length=3 tokens "
        "(truncation='error'); the first is prompt 0, 4 tokens."), errors


def test_the_held_out_file_is_measured(tmp_path):
    config = _file_config(tmp_path, prompts=PROMPTS[:1], max_prompt_length=8)
    held_out = tmp_path / "val.jsonl"
    held_out.write_text(json.dumps({"prompt": "9" * 10, "answer": "0", "data_source": "x"}))
    config.val_env_config = {"path": str(held_out)}
    errors = _length_errors(config)
    assert len(errors) == 1 and errors[0].startswith(
        "val_env_config: 1 of 1 prompts are longer than max_prompt_length=8"), errors


def test_the_door_measures_as_the_env_renders(tmp_path):
    """The lengths are the token counts the env itself serves (its rendering)."""
    from rllib_grpo.models.model_registry import resolve_model
    from rllib_grpo.models.tokenizers import load_tokenizer
    from rllib_grpo.rllib.config.prompt_lengths import _measured
    from rllib_grpo.rllib.config.text_env import make_text_env

    config = _file_config(tmp_path, max_prompt_length=64, data_shuffle=False)
    ((_, measured),) = list(_measured(config))
    env = make_text_env(config, load_tokenizer(resolve_model(config.model_path)), seed=0)
    served = [len(env.reset(options={"index": i})[1]["prompt_token_ids"])
              for i in range(len(PROMPTS))]
    assert list(measured.lengths) == served == [4, 9, 4, 12]


def test_lengths_are_measured_once_until_the_file_changes(tmp_path, monkeypatch):
    from rllib_grpo.rllib.config import prompt_lengths

    calls = []
    measure = prompt_lengths._measure_env
    monkeypatch.setattr(prompt_lengths, "_measure_env",
                        lambda *args: calls.append(1) or measure(*args))
    config = _file_config(tmp_path, max_prompt_length=8)
    for max_prompt_length in (8, 12, 8):
        config.max_prompt_length = max_prompt_length
        _length_errors(config)
    assert len(calls) == 1
    (tmp_path / "train.jsonl").write_text(json.dumps(
        {"prompt": "1" * 20, "answer": "0", "data_source": "x"}) + "\n")
    assert "1 of 1 prompts" in _length_errors(config)[0]
    assert len(calls) == 2


def test_rllib_train_refuses_an_overlong_prompt_before_ray(tmp_path, capsys):
    from rllib_grpo.cli.main import main

    data = _file_config(tmp_path).env_config["path"]
    argv = ["train", "model_path=builtin:tiny", f"data.train_files={data}",
            "data.max_prompt_length=8", "data.max_response_length=4",
            "actor_rollout_ref.rollout.n=4"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("rllib: error: invalid config: env_config: 2 of 4 prompts are longer "
                          "than max_prompt_length=8"), err
