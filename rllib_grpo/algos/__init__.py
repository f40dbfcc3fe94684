"""The pure-torch math of GRPO-family training, matching verl's ``core_algos``.

No Ray and no transformers are imported here (the learner, sampler and driver layers
build on this package, never the reverse).  One module per concept:

* :mod:`~rllib_grpo.algos.registry`: the one name -> function registry all families use;
* :mod:`~rllib_grpo.algos.functional`: masked reductions, log-probs, entropy, group stats;
* :mod:`~rllib_grpo.algos.advantages`: outcome advantage estimators (``grpo``, ``rloo``, ...);
* :mod:`~rllib_grpo.algos.kl`: per-token KL estimators (``k1``, ``k3``, ``k3+``, ...);
* :mod:`~rllib_grpo.algos.kl_control`: fixed / adaptive KL coefficient controllers;
* :mod:`~rllib_grpo.algos.aggregation`: globally normalised loss aggregation;
* :mod:`~rllib_grpo.algos.policy_losses`: surrogate losses (``vanilla``, ``gspo``, ...);
* :mod:`~rllib_grpo.algos.reward_shaping`: DAPO's overlong penalty, scores on last tokens;
* :mod:`~rllib_grpo.algos.lr_schedule`: verl's constant / cosine LR schedules with warm-up.
"""

from rllib_grpo.algos.advantages import ADV_ESTIMATORS, compute_advantage
from rllib_grpo.algos.aggregation import AGG_MODES, agg_loss
from rllib_grpo.algos.functional import (
    entropy_from_logits,
    group_index,
    group_mean_std,
    group_stats,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
    safe_div,
)
from rllib_grpo.algos.kl import KL_ESTIMATORS, kl_kinds, kl_penalty
from rllib_grpo.algos.kl_control import (
    KL_CONTROLLERS,
    AdaptiveKLController,
    FixedKLController,
    KLController,
    get_kl_controller,
)
from rllib_grpo.algos.lr_schedule import LR_SCHEDULER_TYPES, lr_multiplier, num_warmup_steps
from rllib_grpo.algos.policy_losses import POLICY_LOSSES, PolicyLossConfig, policy_loss
from rllib_grpo.algos.registry import Registry
from rllib_grpo.algos.reward_shaping import overlong_penalty, scores_to_tokens

__all__ = [
    "ADV_ESTIMATORS",
    "AGG_MODES",
    "KL_CONTROLLERS",
    "KL_ESTIMATORS",
    "LR_SCHEDULER_TYPES",
    "POLICY_LOSSES",
    "AdaptiveKLController",
    "FixedKLController",
    "KLController",
    "PolicyLossConfig",
    "Registry",
    "agg_loss",
    "compute_advantage",
    "entropy_from_logits",
    "get_kl_controller",
    "group_index",
    "group_mean_std",
    "group_stats",
    "kl_kinds",
    "kl_penalty",
    "logprobs_from_logits",
    "lr_multiplier",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "num_warmup_steps",
    "overlong_penalty",
    "scores_to_tokens",
    "policy_loss",
    "safe_div",
]
