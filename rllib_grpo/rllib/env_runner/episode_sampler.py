"""Sampling multi-turn episodes for the env runner: all episodes of a step, turn by turn.

`TextEnvRunner` hands a multi-turn env (``env.multi_turn``) to
:class:`EpisodeSampler`. Per step:

1. every prompt starts ``group_size`` episodes (a group); each episode has its
   own seed, from (runner seed, group id, index in the group);
2. turn 1 is the same sampler request as a single-turn step (prompts x
   ``group_size``), so a one-turn episode is exactly today's single-turn
   sample;
3. each later turn is **one** sampler call for every episode still running,
   each continuing from its whole conversation so far (prompt, model turns and
   environment replies; vLLM's prefix cache reuses the earlier turns) and
   seeded by (episode seed, turn);
4. the environment answers the turns of all episodes (tool calls of several
   episodes run at once); the renderer (`rllib_grpo.envs.chat`) turns each
   reply into tokens, which go into the response with loss mask 0;
5. an episode ends when the environment ends it, at ``max_turns`` or when its
   token budget (``max_response_length``) is spent (both truncations).

A prompt's images go with every turn's request (its conversation starts with them) and
with its episodes' rows (``multi_modal_inputs``) to the learner.

The result is a `RolloutBatch` with a ``loss_mask`` (`rllib_grpo.data.trajectory`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rllib_grpo.data.rollout import RolloutBatch, build_rollout_batch
from rllib_grpo.data.trajectory import (
    TOKEN_BUDGET,
    TURN_LIMIT,
    EpisodeLimits,
    Trajectory,
    episode_info,
)
from rllib_grpo.envs.chat import ConversationRenderer, conversation_text
from rllib_grpo.envs.multiturn import Episode, MultiTurnTextEnv
from rllib_grpo.samplers import Sample, Sampler, SamplingParams


def is_multi_turn(env: Any) -> bool:
    """True for envs whose episodes last several turns (`MultiTurnTextEnv` and the like)."""
    return bool(getattr(env, "multi_turn", False))


def episode_limits(config: Any) -> EpisodeLimits:
    """The episode limits of a GRPO config."""
    return EpisodeLimits(
        max_response_length=config.max_response_length, max_turns=config.max_turns,
        max_tokens_per_turn=config.max_tokens_per_turn,
        max_observation_tokens=config.max_observation_tokens, gamma=config.gamma)


def check_multi_turn_config(config: Any) -> None:
    """Refuse settings multi-turn sampling does not support (raised before the sampler starts)."""
    if config.adv_estimator == "remax":
        raise ValueError(
            "adv_estimator='remax' needs a greedy baseline response per prompt; with a "
            "multi-turn env that would be a whole greedy episode, which is not implemented. "
            "Use grpo, rloo or another group estimator with multi-turn envs.")


def episode_seed(*entropy: int) -> int:
    """A 31-bit seed from integers: (runner seed, group id, index in group) for an episode,
    (episode seed, turn) for one of its turns."""
    return int(np.random.SeedSequence([int(x) for x in entropy]).generate_state(1)[0] % 2**31)


@dataclass
class LiveEpisode:
    """An episode being sampled: the env's episode, its tokens and its group."""

    episode: Episode
    trajectory: Trajectory
    prompt: dict[str, Any]
    group_id: int
    seed: int
    turns: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    done: bool = False
    # Per model token, the weights version that sampled it (continuous rollouts: a turn's
    # `Sample.token_versions`); empty where one call has one version.
    model_versions: list[int] = dataclasses.field(default_factory=list)

    def token_versions(self) -> list[int]:
        """Per response token, the version of the model token it is or follows: a model
        token's own version, an environment token the version of the model token before it
        (so the episode's oldest version is its oldest *sampled* token's)."""
        versions, model = [], iter(self.model_versions)
        last = self.model_versions[0] if self.model_versions else 0
        for mask in self.trajectory.loss_mask:
            if mask:
                last = next(model)
            versions.append(last)
        return versions


class EpisodeSampler:
    """Drives the episodes of a step through a `MultiTurnTextEnv` with a `Sampler`."""

    def __init__(self, env: MultiTurnTextEnv, sampler: Sampler, tokenizer: Any,
                 limits: EpisodeLimits, seed: int) -> None:
        self.env, self.sampler, self.tokenizer = env, sampler, tokenizer
        self.limits = limits
        self.seed = seed
        self.renderer = ConversationRenderer(tokenizer)
        self.env_seconds = 0.0  # time in the env (tools, rewards) during the last `sample`

    def sample(self, prompts: Sequence[dict[str, Any]], group_ids: Sequence[int],
               group_size: int, params: SamplingParams) -> list[LiveEpisode]:
        """``group_size`` finished episodes per prompt, groups contiguous."""
        self.env_seconds = 0.0
        live = self.start_episodes(prompts, group_ids, group_size)
        groups = self.sampler.generate([p["prompt_token_ids"] for p in prompts], group_size,
                                       dataclasses.replace(params,
                                                           max_tokens=self.limits.turn_tokens(0)),
                                       **prompt_images(prompts))
        samples = [s for group in groups for s in group]
        active = live
        while active:
            self.play_turn(active, samples)
            active = [e for e in active if not e.done]
            if not active:
                break
            allowed = [self.limits.turn_tokens(len(e.trajectory.response_ids)) for e in active]
            outputs = self.sampler.generate(
                [e.trajectory.context_ids() for e in active], 1,
                dataclasses.replace(params, max_tokens=max(allowed)),
                seeds=[self.turn_seed(e) for e in active],
                **prompt_images([e.prompt for e in active]))
            # One call for all: each episode keeps what its own budget allows.
            samples = [_cut(out[0], n) for out, n in zip(outputs, allowed, strict=True)]
        return live

    # The per-episode pieces, shared with the continuous loop (which runs each episode's
    # turns as requests of their own: `rllib_grpo.rllib.env_runner.continuous_episodes`).
    def start_episodes(self, prompts: Sequence[dict[str, Any]], group_ids: Sequence[int],
                       group_size: int) -> list[LiveEpisode]:
        """``group_size`` new episodes per prompt (groups contiguous), each seeded by
        (runner seed, group id, index in the group)."""
        return [
            LiveEpisode(self.env.start_episode(p["index"], seed=seed), Trajectory(
                list(p["prompt_token_ids"])), p, gid, seed)
            for p, gid in zip(prompts, group_ids, strict=True)
            for j in range(group_size)
            for seed in [episode_seed(self.seed, gid, j)]
        ]

    def turn_params(self, episode: LiveEpisode, params: SamplingParams) -> SamplingParams:
        """``params`` with ``max_tokens`` the episode's next model turn may sample."""
        return dataclasses.replace(
            params, max_tokens=self.limits.turn_tokens(len(episode.trajectory.response_ids)))

    @staticmethod
    def turn_seed(episode: LiveEpisode) -> int:
        """The seed of the episode's next model turn after the first: (episode seed, turn)."""
        return episode_seed(episode.seed, episode.trajectory.num_turns)

    def play_turn(self, active: list[LiveEpisode], samples: list[Sample]) -> None:
        """Add each episode's model turn (``samples``, in order), step the env for all of
        them at once and add its replies (or end the episodes: ``LiveEpisode.done``)."""
        texts = []
        for e, sample in zip(active, samples, strict=True):
            e.trajectory.add_model_turn(sample.token_ids, sample.log_probs,
                                        cut=sample.finish_reason == "length")
            if sample.token_versions is not None:
                e.model_versions += list(sample.token_versions)
            texts.append(self.tokenizer.decode(sample.token_ids, skip_special_tokens=True))
        start = time.perf_counter()
        results = self.env.step_many([e.episode for e in active], texts)
        self.env_seconds += time.perf_counter() - start
        budget = self.limits.max_response_length
        for e, sample, text, result in zip(active, samples, texts, results, strict=True):
            trajectory = e.trajectory
            trajectory.rewards.append(float(result.reward))
            e.turns.append(("assistant", text))
            used = len(trajectory.response_ids)
            if result.terminated or result.truncated:
                e.done = True
                if result.truncated:
                    trajectory.truncation = TURN_LIMIT
                elif trajectory.last_turn_cut and used >= budget:
                    trajectory.truncation = TOKEN_BUDGET
                continue
            if self.limits.max_turns is not None and trajectory.num_turns >= self.limits.max_turns:
                e.done, trajectory.truncation = True, TURN_LIMIT
                continue
            reply = self.renderer.continuation_ids(
                sample.token_ids, stopped=sample.finish_reason == "stop", messages=result.messages)
            if self.limits.max_observation_tokens is not None:
                reply = reply[: self.limits.max_observation_tokens]
            if used + len(reply) + 1 > budget:  # no room for the reply and one model token
                e.done, trajectory.truncation = True, TOKEN_BUDGET
                continue
            trajectory.add_env_tokens(reply)
            e.turns += [(m["role"], str(m["content"])) for m in result.messages]

    def to_batch(self, episodes: Sequence[LiveEpisode], *, pad_token_id: int,
                 score_adjustment: Callable[[int, dict], float] | None = None) -> RolloutBatch:
        """The episodes as a `RolloutBatch` with a loss mask (one row per episode)."""
        rows: dict[str, list] = {k: [] for k in ("prompt", "response", "log_probs", "loss_mask",
                                                 "scores", "groups", "truncated", "errors",
                                                 "infos", "versions", "vision")}
        for e in episodes:
            t, summary = e.trajectory, e.episode.summary()
            info: dict[str, Any] = {
                    "reward": t.episode_return(self.limits.gamma), "prompt": e.prompt["text"],
                    "response": self.tokenizer.decode(t.response_ids, skip_special_tokens=True),
                    **{k: summary[k] for k in ("score", "acc", "pred", "reward_error")
                       if k in summary},
                    **episode_info(t, summary),
                    "tool_errors": summary.get("tool_errors", {}),
                    "conversation": conversation_text([("user", e.prompt["text"]), *e.turns])}
            if t.truncation is not None:  # stopped by a limit before any scored answer
                info.setdefault("acc", False)
            if score_adjustment is not None:
                info["reward"] += score_adjustment(len(t.response_ids), info)
            rows["prompt"].append(t.prompt_ids)
            rows["response"].append(t.response_ids)
            rows["log_probs"].append(t.log_probs)
            rows["loss_mask"].append(t.loss_mask)
            rows["versions"].append(e.token_versions() if e.model_versions else [])
            rows["scores"].append(float(info["reward"]))
            rows["groups"].append(e.group_id)
            rows["truncated"].append(t.truncated)
            rows["errors"].append(bool(info.get("reward_error", False)))
            rows["infos"].append(info)
            rows["vision"].append(e.prompt.get("multi_modal_inputs"))
        batch = build_rollout_batch(
            rows["prompt"], rows["response"], rows["log_probs"], rows["scores"], rows["groups"],
            rows["truncated"], rows["errors"], rows["infos"], pad_token_id=pad_token_id,
            loss_masks=rows["loss_mask"], multi_modal_inputs=rows["vision"])
        if any(e.model_versions for e in episodes):  # sampled under changing weights
            versions = np.zeros(batch.response_ids.shape, dtype=np.int64)
            for row, v in enumerate(rows["versions"]):
                versions[row, :len(v)] = v
            batch.token_versions = versions
            # An episode's version is its oldest sampled token's (its staleness the largest).
            batch.weights_version[:] = [min(e.model_versions, default=0) for e in episodes]
        return batch


def prompt_images(prompts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The sampler's ``images`` argument for requests of (or continuing) ``prompts`` (none
    where no prompt has any)."""
    images = [prompt.get("images", ()) for prompt in prompts]
    return {"images": images} if any(images) else {}


def _cut(sample: Sample, max_tokens: int) -> Sample:
    """``sample`` limited to ``max_tokens`` (then ended by ``"length"``)."""
    if len(sample.token_ids) <= max_tokens:
        return sample
    return Sample(sample.token_ids[:max_tokens], sample.log_probs[:max_tokens], "length")
