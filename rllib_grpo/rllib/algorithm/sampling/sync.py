"""`SynchronousSampling` (``max_staleness`` = 0): sample with the current weights, update,
then sync the new weights to the env runners."""

from __future__ import annotations

import time
from typing import Any

from rllib_grpo.data.rollout import RolloutBatch
from rllib_grpo.rllib.algorithm.sampling.strategy import SamplingStrategy
from rllib_grpo.rllib.choreography import EngineHandOver


class SynchronousSampling(SamplingStrategy):
    """``max_staleness`` = 0: sample with the current weights, update, then sync.

    ``sleep_level`` (engines that share the learners' GPUs, ``config.sampler_sleeps``; None:
    they do not sleep): the engines sleep at that level during the update, giving their
    memory to the learners, and wake as `rllib_grpo.rllib.choreography` orders it: the
    learners free their cache, the engines wake their weights, the sync, the KV cache last.
    """

    def __init__(self, *args: Any, sleep_level: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hand_over = None if sleep_level is None else EngineHandOver(
            self.runners, self.learners, sleep_level)
        self._asleep = False

    def sample(self, num_prompts: int) -> RolloutBatch:
        return self.sample_now(num_prompts)

    def draw(self, num_prompts: int) -> RolloutBatch:
        return self.sample_now(num_prompts)

    def before_update(self, rollout: RolloutBatch, next_prompts: int) -> None:
        """The env runners wait for the new weights (their engines asleep, if they sleep)."""
        if self.hand_over is not None and not self._asleep:
            self.hand_over.sleep()
            self._asleep = True

    def after_update(self) -> None:
        """Sync the new weights (into woken engines), so that the next step samples with them."""
        if self.hand_over is None or not self._asleep:
            self.sync_weights()
            return
        t0 = time.perf_counter()
        self.hand_over.wake_for_sync(self.push_weights)
        self._asleep = False
        self.log("timing_s/update_weights", time.perf_counter() - t0)

    def reset(self) -> None:
        """No sample outlives its step; engines left asleep by a failed update wake (the
        restore that follows syncs its weights into them)."""
        if self.hand_over is not None and self._asleep:
            self.hand_over.wake()
            self._asleep = False
