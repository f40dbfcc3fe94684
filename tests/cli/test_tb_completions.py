"""Sampled completions as TensorBoard text under Tune: the RLlib hook puts the table in
the result every N iterations, the Tune callback writes it into the trial's folder."""

from __future__ import annotations

from types import SimpleNamespace

from rllib_grpo.cli.tune import (
    COMPLETIONS_KEY,
    COMPLETIONS_TAG,
    CompletionsTBXCallback,
    ProgressPrinter,
    add_completions,
    install_completions,
    progress_line,
)
from tests.helpers.cli_runs import read_text_summaries

INFOS = [
    {"prompt": "3+4=", "response": "7", "reward": 1.0, "acc": True},
    {"prompt": "2+2=", "response": "5|x", "reward": 0.0, "acc": False},
]


def _algorithm(every: int, infos=INFOS):
    return SimpleNamespace(config=SimpleNamespace(log_completions_every=every),
                           last_rollout=SimpleNamespace(infos=infos))


def test_hook_adds_the_table_every_n_iterations():
    seen = {}
    for iteration in range(1, 7):
        result = {"training_iteration": iteration}
        add_completions(algorithm=_algorithm(3), result=result)
        seen[iteration] = result.get(COMPLETIONS_KEY)
    assert [i for i, text in seen.items() if text] == [3, 6]
    assert "| 3+4= | 7 | 1.0 | True |" in seen[3]
    assert "5\\|x" in seen[3]  # a pipe in a response is escaped, not a new column


def test_hook_is_off_at_zero_and_without_a_rollout():
    result = {"training_iteration": 4}
    add_completions(algorithm=_algorithm(0), result=result)
    add_completions(algorithm=_algorithm(2, infos=[]), result=result)
    add_completions(algorithm=SimpleNamespace(config=SimpleNamespace(log_completions_every=1),
                                              last_rollout=None), result=result)
    assert COMPLETIONS_KEY not in result


def test_install_keeps_existing_hooks_and_is_idempotent():
    from tests.conftest import tiny_config

    def other(**kwargs):
        return None

    config = tiny_config(log_completions_every=2).callbacks(on_train_result=other)
    install_completions(config)
    install_completions(config)
    assert config.callbacks_on_train_result == [other, add_completions]


def test_tune_callback_writes_text_into_the_trial_folder(tmp_path):
    trial = SimpleNamespace(local_path=str(tmp_path))
    callback = CompletionsTBXCallback()
    for iteration in (1, 2):
        result = {"training_iteration": iteration}
        add_completions(algorithm=_algorithm(2), result=result)
        callback.on_trial_result(iteration, [trial], trial, result)
    callback.on_trial_complete(2, [trial], trial)
    texts = read_text_summaries(tmp_path)
    (tag,) = texts
    assert tag.startswith(COMPLETIONS_TAG)
    ((step, text),) = texts[tag]
    assert step == 2 and "| prompt | response | reward | acc |" in text and "3+4=" in text


def test_progress_line_names_the_main_metrics(capsys):
    result = {"training_iteration": 3, "critic/score/mean": 0.5, "actor/kl_loss": 0.001,
              "response_length/mean": 3.25, "time_this_iter_s": 1.23}
    assert progress_line(result) == "iter 3  reward 0.500  len 3.2  kl 0.0010  step 1.23s"
    ppo = {"training_iteration": 1, "env_runners": {"episode_return_mean": 21.5},
           "time_this_iter_s": 0.5}
    assert "return 21.5" in progress_line(ppo)
    ProgressPrinter().on_trial_result(3, ["a"], "a", result)
    assert capsys.readouterr().out.startswith("iter 3  reward 0.500")


def test_multi_turn_rows_show_the_whole_conversation():
    from rllib_grpo.cli.tensorboard import completions_table

    conversation = "user: 3*9=\nassistant: <tool>calculator: 3*9</tool>\ntool: <result>27</result>"
    table = completions_table([{"prompt": "3*9=", "response": "ignored", "reward": 1.0,
                                "acc": True, "conversation": conversation + "\nassistant: 27"}])
    row = table.splitlines()[2]
    assert row.count("<br>") == 3 and "ignored" not in row  # one line per turn, in one row
    assert "&lt;tool&gt;calculator: 3*9&lt;/tool&gt;" in row  # shown, not parsed as HTML
