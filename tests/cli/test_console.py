"""The quiet console: progress lines, the progress bar, and the log-noise filters."""

from __future__ import annotations

import io
import logging
import math
import os

import numpy as np
import pytest

from rllib_grpo import logs
from rllib_grpo.cli.console import Progress, progress_line, startup_line

GRPO_RESULT = {
    "training_iteration": 7, "critic/score/mean": 0.5625, "reward/acc/mean": 0.5,
    "response_length/mean": 2.04, "actor/kl_loss": 0.0123, "timing_s/step": 0.0912,
    "perf/throughput": 3412.4, "timing_s/startup": 9.06,
}


def test_progress_line_names_iteration_reward_accuracy_length_kl_time_and_throughput():
    assert progress_line(GRPO_RESULT, total=400) == (
        "iter   7  reward 0.562  acc 0.500  len 2.0  kl 0.0123  step 0.09s  3,412 tok/s")


def test_progress_line_skips_missing_and_nan_metrics_and_reads_nested_keys():
    ppo = {"training_iteration": 2, "env_runners": {"episode_return_mean": 21.5},
           "time_this_iter_s": 0.5, "actor/kl_loss": math.nan}
    assert progress_line(ppo) == "iter 2  return 21.5  step 0.50s"


def test_progress_prints_lines_and_the_startup_time_once_when_not_a_terminal():
    out = io.StringIO()
    progress = Progress(10, stream=out)
    progress.update(GRPO_RESULT)
    progress.update({**GRPO_RESULT, "training_iteration": 8})
    progress.close()
    lines = out.getvalue().splitlines()
    assert lines[0] == startup_line(GRPO_RESULT) and "9.1s" in lines[0]
    assert [line.split()[:2] for line in lines[1:]] == [["iter", "7"], ["iter", "8"]]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_draws_a_bar_with_eta_and_the_metrics_on_a_terminal():
    out = _Terminal()
    progress = Progress(4, stream=out)
    progress.update(GRPO_RESULT)
    progress.close()
    text = out.getvalue()
    assert "1/4" in text and "%|" in text and "reward 0.562" in text and "3,412 tok/s" in text
    assert "start-up: 9.1s" in text  # written above the bar
    assert "\niter " not in text  # no per-iteration lines under a bar


@pytest.fixture
def clean_console_env(monkeypatch):
    """Undo what quiet_console writes to os.environ (and allow it to install filters)."""
    for key in (logs.QUIET_ENV, *logs.LIBRARY_ENV):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(logs, "_installed", False)
    # Filters an earlier test installed (`rllib train` in-process quiets the console) and
    # those added by this test.
    _remove_noise_filters()
    yield
    _remove_noise_filters()


def _remove_noise_filters() -> None:
    for noise in logs.KNOWN_NOISE:
        log = logging.getLogger(noise.logger)
        log.filters = [f for f in log.filters if not isinstance(f, logs.NoiseFilter)]


def _emitted(logger_name: str, message: str) -> list[str]:
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    handler = Collect()
    log = logging.getLogger(logger_name)
    log.addHandler(handler)
    try:
        log.warning(message)
    finally:
        log.removeHandler(handler)
    return seen


def test_quiet_console_hides_known_noise_and_keeps_other_warnings(clean_console_env):
    noise = ("vllm.v1.worker.cpu_worker",
             "libtcmalloc is not found in LD_PRELOAD. For best performance, ...")
    real = ("vllm.v1.worker.cpu_worker", "KV cache does not fit: lower max_model_len")
    assert _emitted(*noise)  # shown before
    logs.quiet_console()
    assert _emitted(*noise) == []
    assert _emitted(*real) == [real[1]]
    assert os.environ[logs.QUIET_ENV] == "1"
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    assert logs.console_env()[logs.QUIET_ENV] == "1"  # what remote Ray workers receive


def test_verbose_console_changes_nothing(clean_console_env):
    logs.quiet_console(verbose=True)
    assert os.environ[logs.QUIET_ENV] == "0" and "VLLM_LOGGING_LEVEL" not in os.environ
    assert _emitted("ray.tune.utils.util", "Install gputil for GPU system monitoring.")


def test_every_known_noise_pattern_is_a_valid_regex_with_a_reason():
    for noise in logs.KNOWN_NOISE:
        assert noise.why and noise.logger
        logs.NoiseFilter(noise)  # compiles


def test_vllm_reload_drops_only_the_rotary_embedding_notice():
    from rllib_grpo.samplers.vllm import _ComputedBufferNotice

    def record(layer: str) -> logging.LogRecord:
        return logging.LogRecord("vllm.model_executor.model_loader.reload.layerwise",
                                 logging.WARNING, __file__, 1, "%s: Failed to load weights",
                                 (layer,), None)

    notice = _ComputedBufferNotice()
    assert not notice.filter(record("RotaryEmbedding"))
    assert not notice.filter(record("Llama3RotaryEmbedding"))
    assert notice.filter(record("QKVParallelLinear"))  # a real failure still shows


def test_tensorboard_skips_non_finite_scalars():
    from rllib_grpo.cli.tensorboard import scalar_metrics

    metrics = scalar_metrics({"critic/score/mean": 0.5, "val-core/x": 1.0,
                              "timing_s/testing": math.nan, "actor/kl_loss": math.inf})
    assert metrics == {"critic/score/mean": 0.5}


def test_training_metrics_report_the_reward_functions_accuracy():
    from rllib_grpo.data.rollout import build_rollout_batch, data_metrics

    infos = [{"acc": True}, {"acc": False}, {"acc": False}, {"acc": True}]
    batch = build_rollout_batch(
        [[1, 2]] * 4, [[3], [4], [5], [6]], [[-0.1]] * 4, [1.0, 0.2, 0.2, 1.0],
        [0, 0, 1, 1], [False] * 4, [False] * 4, infos, pad_token_id=0)
    assert data_metrics(batch, 4)["reward/acc/mean"] == pytest.approx(0.5)
    no_acc = build_rollout_batch(
        [[1, 2]] * 2, [[3], [4]], [[-0.1]] * 2, [1.0, 0.0], [0, 0], [False] * 2,
        [False] * 2, [{}, {}], pad_token_id=0)
    assert "reward/acc/mean" not in data_metrics(no_acc, 4)
    assert np.isfinite(data_metrics(no_acc, 4)["critic/score/mean"])


def test_startup_is_counted_from_process_start_in_a_driver():
    import time

    import psutil

    from rllib_grpo.rllib.algorithm.grpo import startup_origin

    origin = startup_origin()
    assert origin == pytest.approx(psutil.Process().create_time())
    assert origin < time.time()


def test_the_startup_line_gives_the_seconds_to_the_first_step():
    assert startup_line(GRPO_RESULT) == ("start-up: 9.1s from launch to the first training "
                                         "step (timing_s/startup)")
    assert startup_line({**GRPO_RESULT, "timing_s/startup": float("nan")}) is None
    assert startup_line({"perf/throughput": 1.0}) is None
