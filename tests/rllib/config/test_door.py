"""The door: bad input that once got past `validate()` and failed only after Ray started
(70-131 lines of traceback) is refused before anything runs, one line per problem, by
`GRPOConfig.validate`, `explain` and `rllib train` alike."""

from __future__ import annotations

import json
from pathlib import Path

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
                       "Did you mean 'rllib_grpo/Prompts-v0' or 'rllib_grpo/Geo3K-v0' or "
                       "'rllib_grpo/MATH-v0'?"]


@pytest.mark.parametrize("content, problem", [(None, "no such file"),
                                               ("", "no rows (empty file)")])
def test_the_readme_text_env_dataset_file_is_checked(tmp_path, content, problem):
    """README's own example: ``.environment(TextEnv, env_config={"dataset": "train.jsonl",
    ...})``; a missing or empty file is refused at validate(), not by build_algo()."""
    from rllib_grpo.envs.text import TextEnv

    data = tmp_path / "train.jsonl"
    if content is not None:
        data.write_text(content)
    config = tiny_config().environment(TextEnv)
    config.env_config = {"dataset": str(data)}
    assert _errors(config) == [f"env_config.dataset: {data}: {problem}."]
    with pytest.raises(ValueError, match="env_config.dataset: .*train.jsonl"):
        config.validate()


def test_a_text_env_dataset_given_as_rows_is_not_a_file():
    from rllib_grpo.envs.text import TextEnv

    config = tiny_config().environment(TextEnv)
    config.env_config = {"dataset": [{"prompt": "1+1=", "answer": "2"}]}
    assert _errors(config) == []


# ----------------------------------------------------------- user code in a child process
def _spec(tmp_path) -> str:
    return f"{tmp_path / 'reward.py'}:score"


def test_a_reward_that_kills_its_process_is_refused_naming_it_and_its_file(tmp_path):
    """The door calls the function in a child process: ``os._exit`` (or a crashing
    extension) ends that child, and the check says so in one line."""
    errors = _errors(_prompts(tmp_path, "import os\n\n"
                                        "def score(data_source, s, gt, extra_info=None):\n"
                                        "    os._exit(3)\n"))
    assert errors == [f"env_config.reward_fn={_spec(tmp_path)!r}: reward function score "
                      f"({tmp_path / 'reward.py'}:3) killed its process with exit status 3 when "
                      "called on a sample row (the first row, its ground truth as the "
                      "response)."]


def test_a_segfault_and_a_crash_on_import_are_refused_too(tmp_path):
    segfault = _errors(_prompts(tmp_path, "import ctypes\n\n"
                                          "def score(data_source, s, gt, extra_info=None):\n"
                                          "    return ctypes.string_at(0)\n"))
    assert len(segfault) == 1 and "was killed by signal SIGSEGV when called on a sample row" \
        in segfault[0], segfault
    on_import = _errors(_prompts(tmp_path, "import os\nos._exit(4)\n\n"
                                           "def score(data_source, s, gt, extra_info=None):\n"
                                           "    return 1.0\n"))
    assert on_import == [f"env_config.reward_fn={_spec(tmp_path)!r}: importing "
                         f"{tmp_path / 'reward.py'} killed its process with exit status 4."]


@pytest.mark.processes
def test_a_reward_that_hangs_is_refused_after_the_door_s_limit(tmp_path, monkeypatch):
    import time

    from rllib_grpo.rewards import probe

    monkeypatch.setattr(probe, "PROBE_TIMEOUT_S", 4.0)
    started = tmp_path / "started.pid"
    config = _prompts(tmp_path, "import subprocess, time\n\n"
                                "def score(data_source, s, gt, extra_info=None):\n"
                                "    sleeper = subprocess.Popen(['sleep', '600'])\n"
                                f"    open({str(started)!r}, 'w').write(str(sleeper.pid))\n"
                                "    time.sleep(600)\n")
    start = time.monotonic()
    errors = _errors(config)
    assert time.monotonic() - start < 4.0 + 10.0  # the limit, and the other checks
    assert errors == [f"env_config.reward_fn={_spec(tmp_path)!r}: reward function score "
                      f"({tmp_path / 'reward.py'}:3) did not return within 4 s when called on "
                      "a sample row (the first row, its ground truth as the response)."]
    # What the function started went with it.
    deadline = time.monotonic() + 10.0
    while _running(int(started.read_text())) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(int(started.read_text()))


def _running(pid: int) -> bool:
    """``pid`` is a process that has not ended (gone, or a zombie waiting for its parent)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def test_no_user_code_runs_in_the_checking_process_and_explain_says_it_calls_it(tmp_path):
    """validate() and explain() import and call the function once between them, in
    another process; explain's output says so."""
    import os

    log = tmp_path / "pids.log"
    config = _prompts(tmp_path, f"import os\nopen({str(log)!r}, 'a').write(f'import {{os.getpid()}}\\n')\n\n"
                                "def score(data_source, s, gt, extra_info=None):\n"
                                f"    open({str(log)!r}, 'a').write(f'call {{os.getpid()}}\\n')\n"
                                "    return 1.0\n")
    config.validate()
    text = config.explain()
    entries = log.read_text().split()
    assert entries[0::2] == ["import", "call"] and str(os.getpid()) not in entries[1::2], entries
    assert (f"reward check:                  env_config.reward_fn {_spec(tmp_path)!r} is "
            "imported and called once on the first row (its ground truth as the response), in "
            "a child process, 30 s at most") in text.splitlines()


@pytest.mark.processes
def test_rllib_train_refuses_a_reward_that_kills_its_process_in_one_line(tmp_path):
    """`rllib train` survives the crash: exit 2 and the one line, before Ray starts."""
    import subprocess
    import sys

    config = _prompts(tmp_path, "import os\n\n"
                                "def score(data_source, s, gt, extra_info=None):\n"
                                "    os._exit(3)\n")
    run = subprocess.run(
        [sys.executable, "-c", "from rllib_grpo.cli.main import rllib_main; rllib_main()",
         "train", "--env", "rllib_grpo/Prompts-v0", "--config",
         json.dumps({"env_config": config.env_config}), "model_path=builtin:tiny",
         "prompts_per_step=4", "group_size=4", "max_prompt_length=16", "max_response_length=4",
         "sampler=hf"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    assert run.stderr.strip().splitlines()[-1] == (
        f"rllib: error: invalid config: env_config.reward_fn={_spec(tmp_path)!r}: reward function score "
        f"({tmp_path / 'reward.py'}:3) killed its process with exit status 3 when called on a "
        "sample row (the first row, its ground truth as the response)."), run.stderr[-2000:]
