"""How the driver gets a step's groups: one interface (`strategy.SamplingStrategy`), three
strategies, chosen once from the config (`choose_strategy`; docs/async.md):

* `sync.SynchronousSampling` (``max_staleness`` = 0): sample, update, then sync weights.
* `one_step_off.PipelinedSampling` (``max_staleness`` >= 1): the next step's groups are
  sampled in the background while the learners update.
* `continuous.ContinuousSampling` (``rollout_mode="continuous"``): the env runners never
  stop generating; weights load between two decode steps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rllib_grpo.rllib.algorithm.sampling.continuous import ContinuousSampling
from rllib_grpo.rllib.algorithm.sampling.one_step_off import PipelinedSampling
from rllib_grpo.rllib.algorithm.sampling.prompt_order import PromptOrder
from rllib_grpo.rllib.algorithm.sampling.strategy import SamplingStrategy, dynamic_sampling
from rllib_grpo.rllib.algorithm.sampling.sync import SynchronousSampling
from rllib_grpo.rllib.choreography import sleep_level

if TYPE_CHECKING:
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

__all__ = ["ContinuousSampling", "PipelinedSampling", "PromptOrder", "SamplingStrategy",
           "SynchronousSampling", "choose_strategy", "dynamic_sampling"]


def choose_strategy(config: GRPOConfig, generation_batch_prompts: int,
                    **collaborators: Any) -> SamplingStrategy:
    """The strategy the config asks for, built from ``collaborators`` (the arguments of
    `SamplingStrategy`); ``generation_batch_prompts``: the prompts of one generation batch."""
    c = config
    if c.resolved_rollout_mode() == "continuous":
        return ContinuousSampling(max_staleness=c.max_staleness,
                                  prompts_per_step=generation_batch_prompts, **collaborators)
    if c.max_staleness:
        return PipelinedSampling(max_staleness=c.max_staleness, **collaborators)
    return SynchronousSampling(sleep_level=sleep_level(c) if c.sampler_sleeps else None,
                               **collaborators)
