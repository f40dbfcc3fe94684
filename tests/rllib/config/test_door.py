"""The door: bad input that once got past `validate()` and failed only after Ray started
(70-131 lines of traceback) is refused before anything runs, one line per problem, by
`GRPOConfig.validate`, `explain` and `rllib train` alike."""

from __future__ import annotations

import json

import pytest

from tests.conftest import tiny_config


def _errors(config) -> list[str]:
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(config)


def _prompts(tmp_path, reward: str | None = None):
    """A file env on one row, with ``reward`` as the reward function's source."""
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "x"}) + "\n")
    env_config: dict = {"path": str(data)}
    if reward is not None:
        (tmp_path / "reward.py").write_text(reward)
        env_config["reward_fn"] = f"{tmp_path / 'reward.py'}:score"
    config = tiny_config().environment("rllib_grpo/Prompts-v0")
    config.env_config = env_config  # environment() would merge in Arithmetic's options
    return config


def test_a_negative_count_is_refused():
    errors = _errors(tiny_config().env_runners(num_env_runners=-1))
    assert errors == ["num_env_runners=-1 must be >= 0."]


def test_an_unknown_env_id_is_refused_with_the_nearest_ids():
    errors = _errors(tiny_config().environment("rllib_grpo/Arithmetik-v0"))
    assert len(errors) == 1 and "env='rllib_grpo/Arithmetik-v0' is no registered" in errors[0]
    assert "Did you mean 'rllib_grpo/Arithmetic-v0'" in errors[0]


def test_a_model_folder_needs_weights_and_a_tokenizer(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    only_config = _errors(tiny_config(model_path=str(tmp_path)))
    assert len(only_config) == 1 and "has config.json but no weights (*.safetensors" in \
        only_config[0] and "and no tokenizer (tokenizer.json" in only_config[0], only_config
    (tmp_path / "model.safetensors").write_bytes(b"")
    no_tokenizer = _errors(tiny_config(model_path=str(tmp_path)))
    assert len(no_tokenizer) == 1 and "but no tokenizer" in no_tokenizer[0], no_tokenizer
    (tmp_path / "tokenizer.json").write_text("{}")
    assert _errors(tiny_config(model_path=str(tmp_path))) == []


def test_an_empty_dataset_is_refused(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"prompt": pa.array([], pa.string())}), empty)
    config = tiny_config().environment("rllib_grpo/Prompts-v0")
    config.env_config = {"path": str(empty)}
    errors = _errors(config)
    assert len(errors) == 1 and "no rows" in errors[0], errors
    config.env_config = {"path": []}
    assert _errors(config) == ["env_config.path is an empty list of files: an empty dataset."]


def test_a_reward_file_with_a_syntax_error_names_file_and_line(tmp_path):
    errors = _errors(_prompts(tmp_path, "def score(data_source, s, gt, extra_info=None):\n"
                                        "    return (1.0\n"))
    assert len(errors) == 1 and f"{tmp_path / 'reward.py'}:2: SyntaxError" in errors[0], errors


@pytest.mark.parametrize("returned, shown", [
    ("'high'", "str 'high'"), ("None", "NoneType None"), ("{'acc': 1}", "dict {'acc': 1}"),
])
def test_a_reward_that_returns_no_number_is_refused_naming_the_function(
        tmp_path, returned, shown):
    errors = _errors(_prompts(tmp_path, f"def score(data_source, s, gt, extra_info=None):\n"
                                        f"    return {returned}\n"))
    assert len(errors) == 1 and f"score ({tmp_path / 'reward.py'}:1)" in errors[0], errors
    assert shown in errors[0]


@pytest.mark.parametrize("body", ["return float(s == gt)", "raise KeyError('x')",
                                  "import numpy; return numpy.array(1.0)"])
def test_a_reward_that_scores_or_raises_on_the_sample_passes_the_door(tmp_path, body):
    # Raising on one sample is scored 0 and counted at run time, as before.
    assert _errors(_prompts(tmp_path, f"def score(data_source, s, gt, extra_info=None):\n"
                                      f"    {body}\n")) == []


def test_validate_explain_and_rllib_train_refuse_the_same(tmp_path, capsys):
    from rllib_grpo.cli.main import main

    config = tiny_config().env_runners(num_env_runners=-1)
    with pytest.raises(ValueError, match="num_env_runners=-1 must be >= 0"):
        config.validate()
    assert "num_env_runners=-1" in config.explain()
    argv = ["train", "num_env_runners=-1", "model_path=builtin:tiny", "env=rllib_grpo/Nope-v0"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == "rllib: error: invalid config (2 problems):", err
    assert err[1:] == ["num_env_runners=-1 must be >= 0.",
                       "env='rllib_grpo/Nope-v0' is no registered gymnasium id nor env class. "
                       "Did you mean 'rllib_grpo/Prompts-v0' or 'rllib_grpo/MATH-v0' or "
                       "'rllib_grpo/GSM8K-v0'?"]


@pytest.mark.parametrize("content, problem", [(None, "no such file"),
                                               ("", "no rows (empty file)")])
def test_the_readme_text_env_dataset_file_is_checked(tmp_path, content, problem):
    """README's own example: ``.environment(TextEnv, env_config={"dataset": "train.jsonl",
    ...})``; a missing or empty file is refused at validate(), not by build_algo()."""
    from rllib_grpo.data.env import TextEnv

    data = tmp_path / "train.jsonl"
    if content is not None:
        data.write_text(content)
    config = tiny_config().environment(TextEnv)
    config.env_config = {"dataset": str(data)}
    assert _errors(config) == [f"env_config.dataset: {data}: {problem}."]
    with pytest.raises(ValueError, match="env_config.dataset: .*train.jsonl"):
        config.validate()


def test_a_text_env_dataset_given_as_rows_is_not_a_file():
    from rllib_grpo.data.env import TextEnv

    config = tiny_config().environment(TextEnv)
    config.env_config = {"dataset": [{"prompt": "1+1=", "answer": "2"}]}
    assert _errors(config) == []
