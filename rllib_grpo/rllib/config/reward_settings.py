"""The reward settings: TRL-style ``reward_funcs`` / ``reward_weights``, verl's reward model
keys, and the reward actors that run reward models and LLM judges (docs/reward-models.md).

`RewardSettings` sits between `AlgorithmSettings` and `GRPOSettings` (one table,
`rllib_grpo.rllib.config.settings.SETTINGS_FIELDS`).  No Ray here.
"""

from __future__ import annotations

from dataclasses import dataclass

from rllib_grpo.rllib.config.algorithm_settings import AlgorithmSettings, knob

_RM = "reward_model."
_NEW_RM = "reward.reward_model."  # newer verl nests the reward model under reward.


@dataclass(eq=False, repr=False)  # GRPOConfig inherits these fields, not dataclass equality
class RewardSettings(AlgorithmSettings):
    """Which rewards score a response and where reward models run."""

    reward_funcs: list | None = knob(
        None, "rewards", "TRL-style list of rewards whose weighted sum is the score: None or "
        "'env' (the env's own reward: env_config.reward_fn, else each row's data_source), a "
        "function or 'module:function' or a registered scorer name, a reward model (any other "
        "string: a folder, built-in or cached hub id of a sequence-classification model), "
        "'http://...' (a remote reward in OpenRLHF's protocol), or a dict with 'type' "
        "(model, judge, remote, function; docs/reward-models.md). None = the env's reward "
        "alone. Each is logged as reward/<name>/mean.")
    reward_weights: list | None = knob(
        None, "weights", "One weight per entry of reward_funcs (TRL's reward_weights); None = "
        "1 each.")
    reward_model_enable: bool = knob(
        False, "flag", "verl's reward model switch: score with the model at "
        "reward_model_path instead of the rule reward (reward_funcs=[reward_model_path]).",
        (_RM + "enable", _NEW_RM + "enable"))
    reward_model_path: str | None = knob(
        None, "model", "verl's reward model: a sequence-classification model (folder, "
        "built-in or cached hub id), used when reward_model_enable is on.",
        (_RM + "model.path", _NEW_RM + "model_path"))
    num_reward_workers: int = knob(
        1, "actors", "Ray actors per reward model or local judge; each env-runner batch goes "
        "to one of them in a single call.")
    num_gpus_per_reward_worker: float = knob(
        0, "GPUs", "GPUs each reward actor holds (0 = it runs on CPU); fractional shares "
        "colocate it with other actors.")
    reward_batch_size: int = knob(
        64, "samples", "Samples per forward pass of a reward model or judge on its actor.",
        (_RM + "micro_batch_size_per_gpu", _NEW_RM + "micro_batch_size_per_gpu"))
    reward_model_dtype: str = knob(
        "auto", "dtype", "Weights dtype of reward models and local judges: auto (bfloat16 on "
        "GPU actors, float32 on CPU ones) | float32 | bfloat16 | float16.")
    reward_model_timeout_s: float = knob(
        300.0, "seconds", "How long one batch call to a reward actor or endpoint may take; "
        "a call past it scores its batch 0 (counted, the actor restarted).")
