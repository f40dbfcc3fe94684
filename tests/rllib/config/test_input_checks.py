"""Bad input is caught before any process starts: numbers, the model, the data files."""

from __future__ import annotations

import json
import math

import pytest

from tests.conftest import tiny_config


def _errors(**training) -> list[str]:
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(tiny_config(**training))


@pytest.mark.parametrize("training, needle", [
    ({"lr": -1.0}, "lr=-1.0 must be a finite number > 0"),
    ({"lr": math.nan}, "lr=nan"),
    ({"lr": math.inf}, "lr=inf"),
    ({"lr": [[0, 1e-3], [10, -1e-3]]}, "lr schedule"),
    ({"kl_loss_coef": -0.1}, "kl_loss_coef=-0.1 must be a finite number >= 0"),
    ({"kl_coef": math.nan}, "kl_coef=nan"),
    ({"entropy_coeff": -1e-3}, "entropy_coeff=-0.001"),
    ({"clip_ratio": 0.0}, "clip_ratio=0.0 must be a finite number > 0"),
    ({"clip_ratio_high": -0.2}, "clip_ratio_high=-0.2"),
    ({"clip_ratio_c": math.nan}, "clip_ratio_c=nan must be a finite number"),
    ({"temperature": math.nan}, "temperature=nan"),
    ({"top_p": 0.0}, "top_p=0.0 must be a probability in (0, 1]"),
    ({"weight_decay": -0.01}, "weight_decay=-0.01"),
    ({"grad_clip": -1.0}, "grad_clip=-1.0"),
    ({"betas": (0.9, 1.5)}, "betas=(0.9, 1.5)"),
    ({"keep_checkpoints": -1}, "keep_checkpoints=-1"),
])
def test_numbers_out_of_range_are_refused_naming_the_field(training, needle):
    errors = _errors(**training)
    assert len(errors) == 1 and needle in errors[0], errors


def test_a_warmup_schedule_from_zero_is_accepted():
    assert _errors(lr=[[0, 0.0], [100, 1e-3]]) == []


def test_validate_and_explain_refuse_a_negative_lr():
    with pytest.raises(ValueError, match=r"lr=-1\.0 must be a finite number > 0"):
        tiny_config(lr=-1.0).validate()
    text = tiny_config(lr=-1.0).explain()
    assert "ERRORS:" in text and "lr=-1.0" in text and "No pitfalls found" not in text


def test_the_model_must_be_a_folder_a_builtin_or_an_allowed_hub_id(tmp_path):
    assert _errors(model_path="builtin:tiny") == []
    missing = _errors(model_path=str(tmp_path / "no_model"))
    assert len(missing) == 1 and "no such folder" in missing[0] and "builtin:tiny" in missing[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "without config.json" in _errors(model_path=str(empty))[0]
    hub = _errors(model_path="nobody/no-such-model-here")
    assert len(hub) == 1 and "not in the local cache" in hub[0]
    assert "allow_hub_download=True" in hub[0]
    assert _errors(model_path="nobody/no-such-model-here", allow_hub_download=True) == []


def _file_errors(tmp_path, name: str, content: bytes) -> list[str]:
    path = tmp_path / name
    path.write_bytes(content)
    config = tiny_config().environment("rllib_grpo/Prompts-v0")  # an env that reads files
    config.env_config = {"path": str(path)}
    from rllib_grpo.rllib.config.checks import find_errors

    return find_errors(config)


@pytest.mark.parametrize("name, content, needle", [
    ("bad.jsonl", b'{"prompt": "caf\xe9", "answer": 1}\n', "line 1: not UTF-8 text"),
    ("bad.jsonl", b"\n\nnot json\n", "line 3: invalid JSON"),
    ("bad.jsonl", b"", "no rows"),
    ("bad.csv", b"a,b\n", "unknown prompt file type"),
    ("bad.parquet", b"PAR1 not really", "unreadable"),
])
def test_data_files_must_exist_and_decode(tmp_path, name, content, needle):
    errors = _file_errors(tmp_path, name, content)
    assert len(errors) == 1 and errors[0].startswith("env_config.path: ") and needle in errors[0]


def test_a_good_data_file_passes_and_a_missing_one_is_named(tmp_path):
    row = json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "arithmetic"})
    assert _file_errors(tmp_path, "ok.jsonl", (row + "\n").encode()) == []
    good = tmp_path / "ok.jsonl"  # written by _file_errors above
    config = tiny_config().environment("rllib_grpo/Prompts-v0")
    config.env_config = {"path": str(good)}
    config.val_env_config = {"path": str(tmp_path / "val.jsonl")}
    from rllib_grpo.rllib.config.checks import find_errors

    assert find_errors(config) == [f"val_env_config.path: {tmp_path / 'val.jsonl'}: no such file."]


def test_a_list_of_data_files_is_checked_file_by_file(tmp_path):
    # verl's data.train_files may be a list (run_qwen2-7b_math.sh); the env reads lists,
    # so the check must too, naming the file that is wrong.
    row = json.dumps({"prompt": "1+1=", "answer": "2", "data_source": "arithmetic"})
    good = tmp_path / "ok.jsonl"
    good.write_text(row + "\n")
    config = tiny_config().environment("rllib_grpo/Prompts-v0")
    config.env_config = {"path": [str(good), str(good)]}
    from rllib_grpo.rllib.config.checks import find_errors

    assert find_errors(config) == []
    config.env_config = {"path": [str(good), str(tmp_path / "gone.jsonl")]}
    assert find_errors(config) == [
        f"env_config.path[1]: {tmp_path / 'gone.jsonl'}: no such file."]


# ----------------------------------------------------------------------------- rllib train
@pytest.fixture()
def no_ray(monkeypatch):
    """Fail if `rllib train` gets as far as starting Ray."""
    import rllib_grpo.cli.main as cli

    def started(*args, **kwargs):
        raise AssertionError("Ray was started for bad input")

    monkeypatch.setattr(cli, "run_tune", started)
    return cli


@pytest.mark.parametrize("argv, needle", [
    (["lr=-1"], "lr=-1 must be a finite number > 0"),
    (["actor_rollout_ref.actor.optim.lr=.nan"], "lr=nan"),
    (["model_path=/no/such/model"], "model_path='/no/such/model': no such folder"),
    (["--env", "rllib_grpo/GSM8K-v0", "data.train_files=/no/such/train.jsonl"],
     "env_config.path: /no/such/train.jsonl: no such file"),
])
def test_rllib_train_refuses_bad_input_before_ray_with_exit_2(no_ray, capsys, argv, needle):
    assert no_ray.main(["train", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    # One line, or a header and one line per problem (verl keys bring verl's group_size=1).
    assert err[0].startswith("rllib: error: invalid config") and len(err) in (1, 3), err
    assert any(needle in line for line in err) and "Traceback" not in "".join(err), err


def test_rllib_train_refuses_undecodable_data_and_a_storage_path_under_a_file(
        no_ray, capsys, tmp_path):
    data = tmp_path / "train.jsonl"
    data.write_bytes(b"\xff\xfe binary\n")
    assert no_ray.main(["train", "--env", "rllib_grpo/GSM8K-v0",
                        f"data.train_files={data}"]) == 2
    assert "line 1: not UTF-8 text" in capsys.readouterr().err
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert no_ray.main(["train", "--storage-path", str(blocker / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{blocker} is a file, not a folder" in err[0]


def test_a_failed_trial_is_reported_in_one_line():
    from rllib_grpo.cli.main import one_line_error

    try:
        try:
            raise FileNotFoundError("prompt file not found: /data/x.jsonl")
        except FileNotFoundError as inner:
            raise RuntimeError("Traceback (most recent call last):\n  File ...\n"
                               "FileNotFoundError: wrapped") from inner
    except RuntimeError as outer:
        line = one_line_error(outer)
    assert line == "FileNotFoundError: prompt file not found: /data/x.jsonl"
