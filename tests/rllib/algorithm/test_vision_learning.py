"""GRPO learns from images: the tiny VLM's held-out counting accuracy rises in a short run.

``builtin:demo-vlm`` on ShapeCount-v0 (`rllib_grpo.demo.catalog.vision_demo_config`), the
transformers sampler, 60 steps.  Held-out accuracy is the mean over 64 held-out boards of
each board's share of 8 samples right (temperature 1, as in training).  The margin comes
from this run's own spread: the per-board shares before and after have standard errors
``std / sqrt(64)``; the rise must exceed 3 standard errors of the difference (the two
evaluations draw their samples independently), so chance alone passes it about once in a
thousand runs.  Slow: about 60 training steps plus four evaluations on CPU.
"""

from __future__ import annotations

import numpy as np
import pytest

STEPS = 60


def _per_board_accuracy(algo) -> np.ndarray:
    """Each held-out board's share of right samples (``val_n`` samples at the training
    temperature), the same boards at every call."""
    from rllib_grpo.samplers import SamplingParams

    c = algo.config
    params = SamplingParams(temperature=c.temperature, max_tokens=c.max_response_length)
    samples = algo.env_runner_group.local_env_runner.evaluate(
        c.val_num_prompts, c.val_n, params, start=0)
    by_board: dict[int, list[float]] = {}
    for sample in samples:
        by_board.setdefault(sample.prompt_index, []).append(float(sample.acc))
    return np.asarray([np.mean(v) for v in by_board.values()])


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_the_tiny_vlms_heldout_accuracy_rises(ray_session):
    from rllib_grpo.demo.catalog import vision_demo_config

    algo = vision_demo_config(seed=0, sampler="hf").build_algo()
    try:
        before = _per_board_accuracy(algo)
        for _ in range(STEPS):
            algo.train()
        after = _per_board_accuracy(algo)
    finally:
        algo.stop()
    assert len(before) == len(after) == 64
    standard_error = np.sqrt(before.var(ddof=1) / len(before) + after.var(ddof=1) / len(after))
    rise = after.mean() - before.mean()
    assert rise > 3 * standard_error, (before.mean(), after.mean(), standard_error)
