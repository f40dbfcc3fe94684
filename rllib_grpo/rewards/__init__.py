"""Reward functions for text environments (no Ray, no torch).

Entry points:

* :func:`compute_score` - verl's ``default_compute_score`` contract, dispatching
  on ``data_source``: ``gsm8k``/``openai/gsm8k``; ``math``/``lighteval/MATH``/
  ``DigitalLearningGmbH/MATH-lighteval``/``HuggingFaceH4/MATH-500``;
  ``math_dapo``/``math_dapo_reasoning``/``aime*`` (verl's ±1 DAPO scorer);
  ``arithmetic``; ``countdown``. (verl sends the short name ``math`` to its
  ±1 ``math_dapo`` scorer; here ``math`` is the 0/1 boxed-answer scorer.)
* :func:`resolve_reward_fn` - callable, ``"module:function"`` or a registered name.
* :class:`RewardScorer` - the safe wrapper the env uses (timeouts, errors, format score).
"""

from rllib_grpo.rewards.arithmetic_score import score_arithmetic
from rllib_grpo.rewards.countdown_score import score_countdown
from rllib_grpo.rewards.gsm8k_score import extract_gsm8k_answer, score_gsm8k
from rllib_grpo.rewards.math_dapo_score import score_math_dapo
from rllib_grpo.rewards.math_score import extract_boxed, extract_math_answer, score_math
from rllib_grpo.rewards.reward_registry import (
    RewardFn,
    compute_score,
    get_scorer,
    known_data_sources,
    register_reward_fn,
    resolve_reward_fn,
)
from rllib_grpo.rewards.scorer import (
    DEFAULT_REWARD_TIMEOUT_S,
    RewardContractError,
    RewardScorer,
    normalize_reward_result,
)

__all__ = [
    "DEFAULT_REWARD_TIMEOUT_S",
    "RewardContractError",
    "RewardFn",
    "RewardScorer",
    "compute_score",
    "extract_boxed",
    "extract_gsm8k_answer",
    "extract_math_answer",
    "get_scorer",
    "known_data_sources",
    "normalize_reward_result",
    "register_reward_fn",
    "resolve_reward_fn",
    "score_arithmetic",
    "score_countdown",
    "score_gsm8k",
    "score_math",
    "score_math_dapo",
]
