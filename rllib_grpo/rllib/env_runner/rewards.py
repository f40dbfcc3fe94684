"""The env runner's rewards: the config's reward plan as a `MixedRewardScorer` on its env.

With ``reward_funcs`` (or verl's ``reward_model_enable``) set, each env the runner builds
scores through a mixture (`rllib_grpo.rewards.mixture`): the env's own `RewardScorer` for
the ``"env"`` entry, a `RewardScorer` per other rule function (with the env's timeout and
isolation), `ActorPoolReward` for reward models and local judges (the algorithm's named
actors), `RemoteReward` / `OpenAIJudge` for endpoints.  `reward_metrics` gives the
``reward/<name>/mean`` of a scored batch.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym

from rllib_grpo.rewards.actor_client import ActorPoolReward
from rllib_grpo.rewards.judge import DEFAULT_TEMPLATE, JudgeRule
from rllib_grpo.rewards.mixture import MixedRewardScorer
from rllib_grpo.rewards.remote import OpenAIJudge, RemoteReward
from rllib_grpo.rewards.scorer import RewardScorer
from rllib_grpo.rewards.specs import RewardSpec
from rllib_grpo.rllib.config.reward_plan import REWARD_ACTOR_PREFIX, actor_names, reward_specs
from rllib_grpo.rllib.stacks import RUN_ID_ATTRIBUTE, report_hang


def _component(spec: RewardSpec, config: Any, env: gym.Env, worker_index: int,
               log_dir: str | None) -> Any:
    base: Any = getattr(env, "scorer", None)
    if spec.kind == "function":
        if spec.source is None:
            if not isinstance(base, RewardScorer):
                raise TypeError(f"reward_funcs names the env's own reward, but "
                                f"{type(env).__name__} has no RewardScorer (env.scorer)")
            return base
        if not isinstance(base, RewardScorer):
            return RewardScorer(spec.source)
        return RewardScorer(spec.source, timeout_s=base.timeout_s, workers=base.pool.max_workers)
    timeout = config.reward_model_timeout_s
    if spec.kind == "remote":
        return RemoteReward(str(spec.source), timeout_s=timeout)
    if not spec.on_actors:  # a judge behind an OpenAI-compatible server
        return OpenAIJudge(str(spec.url), str(spec.source),
                           str(spec.options.get("template", DEFAULT_TEMPLATE)),
                           JudgeRule.from_options(spec.options), timeout_s=timeout,
                           max_tokens=int(spec.options.get("max_tokens", 16)),
                           api_key=spec.options.get("api_key"))
    prefix = getattr(config, REWARD_ACTOR_PREFIX, None)
    if prefix is None:
        raise RuntimeError(f"reward {spec.name!r} runs on reward actors, which the GRPO "
                           "algorithm starts: build the env runner through GRPOConfig."
                           "build_algo()")
    return ActorPoolReward(actor_names(prefix, spec, config.num_reward_workers),
                           timeout_s=timeout, first=worker_index,
                           report_stuck=stuck_reward_reporter(config, log_dir))


def stuck_reward_reporter(config: Any, log_dir: str | None) -> Callable[[str, str, Any], str]:
    """What names a reward actor call that overran its timeout: the actor (its role, node,
    pid, GPU ids) and the stack file of every process of the run, written to ``log_dir``
    (the algorithm's log folder; a temporary one for an env runner built alone)."""

    def report(message: str, name: str, handle: Any) -> str:
        run_id = getattr(config, RUN_ID_ATTRIBUTE, None)
        if not run_id:
            return message
        folder = log_dir or tempfile.gettempdir()
        return report_hang(run_id, message, folder, {f"reward actor {name}": handle})

    return report


def install_reward_mixture(env: gym.Env, config: Any, worker_index: int = 0,
                           log_dir: str | None = None) -> None:
    """Give ``env`` the config's reward mixture (nothing when the env's reward scores
    alone); a reward actor that hangs is reported with a stack file in ``log_dir``."""
    specs = reward_specs(config)
    if specs is None:
        return
    components = [(spec.name, spec.weight, _component(spec, config, env, worker_index,
                                                      log_dir))
                  for spec in specs]
    env.unwrapped.scorer = MixedRewardScorer(components)


def reward_metrics(infos: Sequence[dict[str, Any]]) -> dict[str, float]:
    """``reward/<name>/mean`` over the samples each reward applied to."""
    sums: dict[str, list[float]] = {}
    for info in infos:
        for name, value in (info.get("reward_components") or {}).items():
            if value is not None:
                sums.setdefault(name, []).append(float(value))
    return {f"reward/{name}/mean": sum(values) / len(values) for name, values in sums.items()}
