"""`TextEnvRunner`: an RLlib `EnvRunner` that samples prompt groups from a `TextEnv`.

For each prompt it resets the env (the env owns the data order), has its
`Sampler` generate the group's responses in one request, and scores each
response by resetting the env to that prompt and stepping it with the
response text.  Reward functions therefore run here, next to the data, in
every runner in parallel.  It returns a `RolloutBatch`.

Multi-turn envs (``env.multi_turn``) take a separate branch: the episodes of a
step are played turn by turn by `rllib_grpo.rllib.env_runner.episode_sampler.EpisodeSampler`.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID
from ray.rllib.env.env_runner import EnvRunner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    NUM_ENV_STEPS_SAMPLED,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
    NUM_EPISODES,
    NUM_EPISODES_LIFETIME,
)

from rllib_grpo.algos import overlong_penalty
from rllib_grpo.data.recipes import ValidationSample
from rllib_grpo.data.rollout import RolloutBatch, build_rollout_batch
from rllib_grpo.models.lora import AdapterMerger, is_lora_payload
from rllib_grpo.models.model_registry import resolve_model
from rllib_grpo.models.tokenizers import load_tokenizer
from rllib_grpo.models.vision import ImagePromptProcessor, vision_model_type
from rllib_grpo.rllib.config.text_env import (
    VALIDATION_SEED_OFFSET,
    data_seed,
    make_text_env,
    validation_env_config,
)
from rllib_grpo.rllib.env_runner.engine import (
    engine_options,
    engine_whereabouts,
    sampler_kind,
)
from rllib_grpo.rllib.env_runner.episode_sampler import (
    EpisodeSampler,
    check_multi_turn_config,
    episode_limits,
    is_multi_turn,
    prompt_images,
)
from rllib_grpo.rllib.env_runner.rewards import install_reward_mixture, reward_metrics
from rllib_grpo.rllib.placement import hide_unassigned_gpus, hold_engine_shards, whereabouts
from rllib_grpo.rllib.stacks import enable_stack_dumps_for
from rllib_grpo.samplers import SamplingParams, make_sampler
from rllib_grpo.weights.shm import SharedWeights

COMPONENT_RL_MODULE = "rl_module"
WEIGHTS_SEQ_NO = "weights_seq_no"


def _seek(env: gym.Env, start: int | None) -> None:
    """Move ``env`` to position ``start`` of its epoch-by-epoch prompt order."""
    if start is None:
        return
    if not hasattr(env, "seek"):
        raise TypeError(f"{type(env).__name__} has no seek(position): env runners share one "
                        "prompt order through it; subclass rllib_grpo.envs.text.TextEnv.")
    env.seek(start)


def runner_role(worker_index: int, evaluation: bool, class_name: str) -> str:
    """``env runner 2 (TextEnvRunner)``, ``evaluation env runner 1 (...)`` or ``the local
    env runner (...)``: how stack files and hang reports name an env runner."""
    kind = "evaluation env runner" if evaluation else "env runner"
    return (f"{kind} {worker_index}" if worker_index else f"the local {kind}") + \
        f" ({class_name})"


class TextEnvRunner(EnvRunner, Checkpointable):
    """Samples groups of responses per prompt with a `Sampler` and scores them in a `TextEnv`."""

    def __init__(self, *, config: Any, **kwargs: Any) -> None:
        hide_unassigned_gpus()  # before anything initialises CUDA
        super().__init__(config=config, **kwargs)
        c = self.config
        self.worker_index = kwargs.get("worker_index", 0) or 0
        # Before anything that may hang (the engine's start, the reward actors' look-up):
        # the run's deadlines can then show this process's stack (rllib_grpo.rllib.stacks).
        enable_stack_dumps_for(c, runner_role(self.worker_index, c.in_evaluation,
                                              type(self).__name__))
        self.log_dir: str | None = kwargs.get("log_dir")  # the algorithm's (stack files)
        seed = (c.seed or 0) + self.worker_index  # each runner samples its own responses
        model_path = resolve_model(c.model_path)
        self.tokenizer = load_tokenizer(model_path)
        # A vision-language model's prompts with images render through its processor.
        self.processor = (ImagePromptProcessor.from_pretrained(model_path)
                          if vision_model_type(model_path) else None)
        # ... but all runners hold the same prompts in the same shared order.
        self.env = make_text_env(c, self.tokenizer, data_seed(c), processor=self.processor)
        # reward_funcs, reward models
        install_reward_mixture(self.env, c, self.worker_index, self.log_dir)
        if is_multi_turn(self.env):
            check_multi_turn_config(c)  # before the (expensive) sampler starts
        self._val_env: gym.Env | None = None
        kind = sampler_kind(c)
        self.engine_shards = hold_engine_shards(c.startup_timeout_s)  # fake GPUs only
        self.sampler = make_sampler(
            kind, model_path=model_path, dtype=c.sampler_dtype, seed=seed,
            **engine_options(c, model_path, kind, self.worker_index),
        )
        self._weights_seq_no = 0
        self._group_counter = 0
        self._torch_gen_seed = seed
        self.last_weight_sync: dict[str, float] = {}
        # The node's shared weights file, mapped (`weight_receiver.runner_receive_shared`),
        # and a vLLM engine's update in progress: bytes so far and its start (perf_counter).
        self.shared_weights: SharedWeights | None = None
        self.weight_update: dict[str, float] = {}
        self._episodes = (EpisodeSampler(self.env, self.sampler, self.tokenizer,
                                         episode_limits(c), seed)
                          if is_multi_turn(self.env) else None)

    # ------------------------------------------------------------------ EnvRunner API
    @override(EnvRunner)
    def assert_healthy(self) -> None:
        assert self.env is not None and self.sampler is not None, "TextEnvRunner not set up"

    def placement_report(self) -> dict[str, Any]:
        """Where this env runner and each TP shard of its engine run (`whereabouts`)."""
        return {"runner": whereabouts(),
                "engine": engine_whereabouts(self.sampler, self.engine_shards)}

    @override(EnvRunner)
    def get_spaces(self) -> dict[str, tuple[gym.Space, gym.Space]]:
        spaces = (self.config.observation_space, self.config.action_space)
        return {"__env__": spaces, DEFAULT_MODULE_ID: spaces}

    def sampling_params(self) -> SamplingParams:
        c = self.config
        return SamplingParams(
            temperature=c.temperature, top_p=c.top_p, top_k=c.top_k,
            max_tokens=c.max_response_length,
        )

    @override(EnvRunner)
    def sample(self, num_prompts: int | None = None, start: int | None = None,
               **kwargs: Any) -> RolloutBatch:
        """Sample ``num_prompts`` groups of ``group_size`` scored responses, for the prompts
        at positions ``start ..`` of the shared order (None: where this env stands).

        Every trajectory carries ``weights_version``: the learner update count of the
        weights this runner holds (weights change only between calls, never inside one)."""
        c = self.config
        num_prompts = num_prompts or c.prompts_per_step
        _seek(self.env, start)
        batch = (self._sample_episodes(num_prompts) if self._episodes is not None
                 else self._sample_groups(num_prompts))
        batch.weights_version[:] = self._weights_seq_no  # one call, one policy version
        return batch

    def _sample_groups(self, num_prompts: int) -> RolloutBatch:
        """Single-turn branch of `sample`: one generate call for every group."""
        c = self.config
        t0 = time.perf_counter()
        prompts = [self._next_prompt(self.env) for _ in range(num_prompts)]
        groups = self.sampler.generate(
            [p["prompt_token_ids"] for p in prompts], c.group_size, self.sampling_params(),
            **prompt_images(prompts))
        t_gen = time.perf_counter() - t0
        baselines = self._greedy_baselines(prompts) if c.adv_estimator == "remax" else None
        rows: dict[str, list] = {k: [] for k in (
            "prompt_ids", "response_ids", "log_probs", "scores", "group_index", "truncated",
            "errors", "infos", "baselines", "vision")}
        # Every response of the step is scored at once: reward calls run in parallel.
        scored = iter(self._score_many(self.env, [(prompt, sample.token_ids)
                                                  for prompt, group in zip(prompts, groups, strict=True)
                                                  for sample in group]))
        for i, (prompt, group) in enumerate(zip(prompts, groups, strict=True)):
            group_id = self._group_counter
            self._group_counter += 1
            for sample in group:
                info = next(scored)
                info["reward"] += self._overlong_penalty(len(sample.token_ids), info)
                rows["prompt_ids"].append(prompt["prompt_token_ids"])
                rows["response_ids"].append(list(sample.token_ids))
                rows["log_probs"].append(list(sample.log_probs))
                rows["scores"].append(float(info["reward"]))
                rows["group_index"].append(group_id)
                rows["truncated"].append(sample.finish_reason == "length")
                rows["errors"].append(bool(info.get("reward_error", False)))
                rows["infos"].append(info)
                rows["baselines"].append(baselines[i] if baselines else 0.0)
                rows["vision"].append(prompt.get("multi_modal_inputs"))  # one per group
        batch = build_rollout_batch(
            rows["prompt_ids"], rows["response_ids"], rows["log_probs"], rows["scores"],
            rows["group_index"], rows["truncated"], rows["errors"], rows["infos"],
            pad_token_id=self.tokenizer.pad_token_id or 0, reward_baselines=rows["baselines"],
            multi_modal_inputs=rows["vision"],
        )
        self._log_sample_metrics(len(batch), t_gen, time.perf_counter() - t0 - t_gen)
        self._log_reward_metrics(rows["infos"])
        return batch

    def _log_reward_metrics(self, infos: list[dict[str, Any]]) -> None:
        """``reward/<name>/mean`` of a mixture's rewards and ``timing_s/reward/<name>``, the
        seconds each took on the last batch (`rllib_grpo.rllib.env_runner.rewards`)."""
        for key, value in reward_metrics(infos).items():
            self.metrics.log_value(key, value, reduce="mean", window=1)
        scorer: Any = getattr(self.env.unwrapped, "scorer", None)
        for name, seconds in getattr(scorer, "last_seconds", {}).items():
            self.metrics.log_value(f"timing_s/reward/{name}", seconds, reduce="mean", window=1)

    def _sample_episodes(self, num_prompts: int) -> RolloutBatch:
        """Multi-turn branch of `sample`: the step's episodes, every turn batched."""
        c, episode_sampler = self.config, self._episodes
        assert episode_sampler is not None, "a multi-turn env builds an EpisodeSampler"
        t0 = time.perf_counter()
        prompts = [self._next_prompt(self.env) for _ in range(num_prompts)]
        group_ids = list(range(self._group_counter, self._group_counter + num_prompts))
        self._group_counter += num_prompts
        episodes = episode_sampler.sample(prompts, group_ids, c.group_size,
                                          self.sampling_params())
        batch = episode_sampler.to_batch(episodes, pad_token_id=self.tokenizer.pad_token_id or 0,
                                         score_adjustment=self._overlong_penalty)
        t_env = episode_sampler.env_seconds
        self._log_sample_metrics(len(batch), time.perf_counter() - t0 - t_env, t_env)
        return batch

    def _overlong_penalty(self, response_length: int, info: dict[str, Any]) -> float:
        """DAPO's soft overlong punishment, added to the reward (``acc`` is unchanged)."""
        c = self.config
        if not c.overlong_buffer_len or c.overlong_buffer_enable is False:
            return 0.0
        penalty = float(overlong_penalty(torch.tensor([response_length]), c.max_response_length,
                                         c.overlong_buffer_len, c.overlong_penalty_factor)[0])
        info["overlong_reward"] = penalty
        info["overlong"] = penalty < 0
        return penalty

    def _greedy_baselines(self, prompts: list[dict[str, Any]]) -> list[float]:
        """ReMax: the reward of each prompt's greedy response (verl's ``gen_max``)."""
        greedy = SamplingParams(temperature=0.0, max_tokens=self.config.max_response_length)
        outputs = self.sampler.generate([p["prompt_token_ids"] for p in prompts], 1, greedy,
                                        **prompt_images(prompts))
        scored = self._score_many(self.env, [(p, out[0].token_ids)
                                             for p, out in zip(prompts, outputs, strict=True)])
        return [float(info["reward"]) for info in scored]

    def evaluate(self, num_prompts: int, n: int, params: SamplingParams,
                 start: int | None = None) -> list[ValidationSample]:
        """Sample ``n`` responses with ``params`` for ``num_prompts`` held-out prompts (at
        positions ``start ..`` of the held-out order; None: the next ones) and score them."""
        env = self._validation_env()
        _seek(env, start)
        if self._episodes is not None:
            return self._evaluate_episodes(env, num_prompts, n, params)
        prompts = [self._next_prompt(env) for _ in range(num_prompts)]
        outputs = self.sampler.generate([p["prompt_token_ids"] for p in prompts], n, params,
                                        **prompt_images(prompts))
        samples = []
        scored = iter(self._score_many(env, [(prompt, sample.token_ids) for prompt, group
                                             in zip(prompts, outputs, strict=True) for sample in group]))
        for prompt, group in zip(prompts, outputs, strict=True):
            for _ in group:
                info = next(scored)
                samples.append(ValidationSample(
                    prompt_index=int(prompt["index"]), data_source=str(prompt["data_source"]),
                    score=float(info["reward"]),
                    acc=None if info.get("acc") is None else float(info["acc"]),
                    pred=info.get("pred"), has_pred="pred" in info))
        return samples

    def validation_set_size(self) -> int:
        """Prompts in the held-out set (the validation env's dataset)."""
        return int(self._validation_env().unwrapped.num_prompts)

    def _evaluate_episodes(self, env: gym.Env, num_prompts: int, n: int,
                           params: SamplingParams) -> list[ValidationSample]:
        """Multi-turn branch of `evaluate`: whole episodes, scored by their return."""
        prompts = [self._next_prompt(env) for _ in range(num_prompts)]
        runner = EpisodeSampler(env, self.sampler, self.tokenizer, episode_limits(self.config),
                                self._torch_gen_seed + 10_007)
        episodes = runner.sample(prompts, list(range(len(prompts))), n, params)
        batch = runner.to_batch(episodes, pad_token_id=self.tokenizer.pad_token_id or 0)
        return [ValidationSample(
            prompt_index=int(e.prompt["index"]), data_source=str(e.prompt["data_source"]),
            score=float(info["reward"]), acc=None if info.get("acc") is None else float(info["acc"]),
            pred=info.get("pred"), has_pred="pred" in info)
            for e, info in zip(episodes, batch.infos, strict=True)]

    def _validation_env(self) -> gym.Env:
        if self._val_env is None:
            # A different seed: held-out order (and, for generated tasks, problems).
            self._val_env = make_text_env(
                self.config, self.tokenizer, data_seed(self.config) + VALIDATION_SEED_OFFSET,
                env_config=validation_env_config(self.config), processor=self.processor)
            install_reward_mixture(self._val_env, self.config, self.worker_index, self.log_dir)
        return self._val_env

    @staticmethod
    def _next_prompt(env: gym.Env) -> dict[str, Any]:
        obs, info = env.reset()
        if isinstance(obs, dict):  # a prompt with images: {"text", "images"}
            return {**obs, **info}
        return {"text": obs, **info}

    def _score_many(self, env: gym.Env, items: list[tuple[dict[str, Any], list[int]]]
                    ) -> list[dict[str, Any]]:
        """Score ``(prompt, response ids)`` pairs: all at once through the env's
        `score_many` (parallel reward calls), else one episode each."""
        texts = [self.tokenizer.decode(ids, skip_special_tokens=True) for _, ids in items]
        if hasattr(env, "score_many"):
            infos = env.score_many([(p["index"], text) for (p, _), text in zip(items, texts, strict=True)])
            rewards = [float(info["score"]) for info in infos]
        else:
            infos, rewards = [], []
            for (prompt, _), text in zip(items, texts, strict=True):
                env.reset(options={"index": prompt["index"]})
                _, reward, _, _, info = env.step(text)
                infos.append(info)
                rewards.append(reward)
        return [{"reward": reward, "prompt": prompt["text"], "index": prompt["index"],
                 "response": text, **{
            k: v for k, v in info.items() if k in ("score", "acc", "pred", "reward_error",
                                                 "reward_error_message", "reward_components")}}
            for (prompt, _), text, reward, info in zip(items, texts, rewards, infos, strict=True)]

    def _log_sample_metrics(self, num_trajectories: int, t_gen: float, t_reward: float) -> None:
        m = self.metrics
        m.log_value(NUM_ENV_STEPS_SAMPLED, num_trajectories, reduce="sum")
        m.log_value(NUM_ENV_STEPS_SAMPLED_LIFETIME, num_trajectories, reduce="lifetime_sum")
        m.log_value(NUM_EPISODES, num_trajectories, reduce="sum")
        m.log_value(NUM_EPISODES_LIFETIME, num_trajectories, reduce="lifetime_sum")
        m.log_value("timing_s/gen", t_gen, reduce="mean", window=1)
        m.log_value("timing_s/reward", t_reward, reduce="mean", window=1)
        dataset: Any = getattr(self.env, "dataset", None)
        if hasattr(dataset, "skipped_metrics"):  # rows dropped at load, by kind
            for key, count in dataset.skipped_metrics().items():
                m.log_value(key, count, reduce="mean", window=1)
        self.num_env_steps_sampled_lifetime += num_trajectories

    @override(EnvRunner)
    def get_metrics(self) -> dict:
        return self.metrics.reduce()

    # ------------------------------------------------------------------ weights and state
    @override(Checkpointable)
    def set_state(self, state: dict[str, Any]) -> None:
        """Apply learner weights (``rl_module``) and/or a checkpointed runner state."""
        if COMPONENT_RL_MODULE in state:
            seq_no = state.get(WEIGHTS_SEQ_NO, 0)
            if seq_no == 0 or self._weights_seq_no < seq_no:
                module_state = state[COMPONENT_RL_MODULE]
                if isinstance(module_state, ray.ObjectRef):  # remote runners get a reference
                    module_state = ray.get(module_state)
                module_state = module_state.get(DEFAULT_MODULE_ID, module_state)
                if isinstance(module_state, ray.ObjectRef):
                    module_state = ray.get(module_state)
                self.weights_received(self._load_weights(module_state), seq_no)
            self._weights_seq_no = max(self._weights_seq_no, seq_no)
        if "env" in state:
            self.env.set_state(state["env"])
        if "rng" in state:
            torch.set_rng_state(state["rng"]["torch"])
            np.random.set_state(state["rng"]["numpy"])
            self._group_counter = state["rng"]["group_counter"]
            if "sampler_calls" in state["rng"] and hasattr(self.sampler, "seeds"):
                self.sampler.seeds.calls = state["rng"]["sampler_calls"]
        if NUM_ENV_STEPS_SAMPLED_LIFETIME in state:
            self.num_env_steps_sampled_lifetime = state[NUM_ENV_STEPS_SAMPLED_LIFETIME]

    def _load_weights(self, module_state: Any) -> dict[str, Any]:
        """A full HF state dict, or a LoRA sync merged here (`rllib_grpo.models.lora.AdapterMerger`)."""
        if not is_lora_payload(module_state):
            return self.sampler.load_weights(module_state)
        if getattr(self, "_lora_merger", None) is None:
            self._lora_merger = AdapterMerger(resolve_model(self.config.model_path),
                                              self.config.sampler_dtype)
        return self._lora_merger.apply(self.sampler, module_state)

    def forget_weights_version(self) -> None:
        """The learners were restored to weights whose version may be older than this
        sampler's: load the next weights that arrive, whatever their version, and take it."""
        self._weights_seq_no = 0

    def weights_received(self, stats: dict[str, Any], seq_no: int) -> None:
        """Record a sync that the driver's weight sync loaded (`weight_receiver`): its bytes
        and seconds, and the weights' version it brought."""
        self.last_weight_sync = stats
        self._weights_seq_no = max(self._weights_seq_no, seq_no)
        self.metrics.log_value("weight_sync/bytes", stats.get("bytes", 0), reduce="mean",
                               window=1)
        self.metrics.log_value("timing_s/load_weights", stats.get("seconds", 0.0),
                               reduce="mean", window=1)

    @override(Checkpointable)
    def get_state(self, components=None, *, not_components=None, **kwargs) -> dict[str, Any]:
        """Data position and RNG state, so a restored run continues the same prompts."""
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
               "group_counter": self._group_counter}
        if hasattr(self.sampler, "seeds"):  # the per-call seed stream of both samplers
            rng["sampler_calls"] = self.sampler.seeds.calls
        return {"env": self.env.get_state(), "rng": rng, WEIGHTS_SEQ_NO: self._weights_seq_no,
                NUM_ENV_STEPS_SAMPLED_LIFETIME: self.num_env_steps_sampled_lifetime}

    @override(Checkpointable)
    def get_ctor_args_and_kwargs(self):
        return (), {"config": self.config}

    @override(Checkpointable)
    def get_checkpointable_components(self):
        return []

    @override(EnvRunner)
    def stop(self) -> None:
        loop = getattr(self, "rollout_loop", None)  # continuous rollouts: stop stepping first
        if loop is not None:
            loop.close()
        if self.shared_weights is not None:
            self.shared_weights.close()
        if self.sampler is not None and hasattr(self.sampler, "close"):
            self.sampler.close()
        for env in (self.env, self._val_env):  # end the reward worker processes
            scorer: Any = getattr(env, "scorer", None)
            if hasattr(scorer, "close"):
                scorer.close()
