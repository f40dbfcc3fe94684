"""`rllib train` sets Tune's failure handling: a failed trial restarts from its newest
complete checkpoint (``--max-failures``, default 3) with its result files cut to it
(`ContinueTrialResults`)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("argv, expected", [([], 3), (["--max-failures", "0"], 0)])
def test_rllib_train_restarts_failed_trials(monkeypatch, argv, expected):
    from ray import tune

    import rllib_grpo.cli.run as run
    from rllib_grpo.cli.main import main
    from rllib_grpo.cli.resume import ContinueTrialResults

    made: dict = {}

    def tuner(trainable, **kwargs):
        made.update(kwargs)
        return "tuner"

    monkeypatch.setattr(run, "_init_ray", lambda args: False)
    monkeypatch.setattr(run, "_fit", lambda t: 0)
    monkeypatch.setattr(tune, "Tuner", tuner)
    assert main(["train", "model_path=builtin:tiny", "sampler=hf", *argv]) == 0
    run_config = made["run_config"]
    assert run_config.failure_config.max_failures == expected
    assert any(isinstance(c, ContinueTrialResults) for c in run_config.callbacks)


def test_resume_keeps_the_runs_failure_handling(capsys):
    from rllib_grpo.cli.main import main

    assert main(["train", "--resume", "/no/run", "--max-failures", "1"]) == 2
    assert "drop --max-failures" in capsys.readouterr().err
