"""The reward actors: reward models and local LLM judges on a pool of Ray actors.

The algorithm (driver) starts them before its env runners (`RewardActors.start`), one pool
of ``num_reward_workers`` named actors per reward that runs on actors (a reward model or
a judge without a URL), each with ``num_gpus_per_reward_worker`` GPUs; their names'
prefix goes on the config (`reward_plan.REWARD_ACTOR_PREFIX`), and the env runners score
through `rllib_grpo.rewards.actor_client.ActorPoolReward`.  The actors never train and
never get weight syncs: a reward model is fixed for the run.  Ray restarts a dead one
(``max_restarts=-1``); `stop` ends them with the algorithm.

`RewardWorker` holds one of:

* `SequenceClassifierReward` (`rllib_grpo.rewards.reward_model`);
* `LocalJudge`: a causal LM with a template and a parse rule
  (`rllib_grpo.rewards.judge`); the ``range`` rule generates greedily with the package's
  sampler (vLLM where it is installed, the transformers sampler otherwise; ``sampler`` in the
  judge's spec chooses), the ``yes`` rule reads one forward pass's next-token distribution.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from typing import Any

from rllib_grpo.models.model_registry import resolve_model
from rllib_grpo.rewards.judge import (
    DEFAULT_TEMPLATE,
    JudgeRule,
    render_judge_prompt,
    yes_no_token_ids,
    yes_probability,
)
from rllib_grpo.rewards.reward_model import SequenceClassifierReward
from rllib_grpo.rewards.specs import RewardSpec
from rllib_grpo.rllib.algorithm.placement_group import RunPlacement
from rllib_grpo.rllib.config.gpu_layout import REWARD_WORKER
from rllib_grpo.rllib.config.reward_plan import (
    REWARD_ACTOR_PREFIX,
    actor_names,
    actor_specs,
    reward_dtype,
)
from rllib_grpo.rllib.stacks import RUN_ID_ATTRIBUTE, enable_stack_dumps

logger = logging.getLogger(__name__)


class LocalJudge:
    """A causal LM that grades (prompt, response) pairs (module docstring)."""

    def __init__(self, path: str, options: dict[str, Any], *, dtype: str = "float32",
                 batch_size: int = 16, seed: int = 0) -> None:
        from transformers import AutoTokenizer

        self.path, self.dtype, self.batch_size = path, dtype, max(1, batch_size)
        self.template = str(options.get("template", DEFAULT_TEMPLATE))
        self.rule = JudgeRule.from_options(options)
        self.max_tokens = int(options.get("max_tokens", 16))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self._model: Any = None
        self._sampler: Any = None
        if self.rule.kind == "range":
            from rllib_grpo.samplers import make_sampler

            self._sampler = make_sampler(str(options.get("sampler", "auto")), model_path=path,
                                         dtype=dtype, seed=seed)
        else:
            import torch
            from transformers import AutoModelForCausalLM

            self._model = AutoModelForCausalLM.from_pretrained(
                path, dtype=getattr(torch, dtype)).eval()
            self._yes, self._no = yes_no_token_ids(self.tokenizer)

    def prompt_ids(self, prompt: Any, response: str, ground_truth: Any) -> list[int]:
        """The judge's input token ids for one sample."""
        text = render_judge_prompt(self.tokenizer, self.template, prompt, response, ground_truth)
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        return list(self.tokenizer.encode(text, add_special_tokens=not templated))

    def score(self, prompts: Sequence[Any], responses: Sequence[str],
              ground_truths: Sequence[Any]) -> list[Any]:
        """A score in [0, 1] per sample, or a `ValueError` for a sample whose judgement
        does not parse (scored 0 and counted by the mixture)."""
        ids = [self.prompt_ids(p, r, g) for p, r, g in zip(prompts, responses, ground_truths,
                                                             strict=True)]
        if self._sampler is not None:
            return self._generate_and_parse(ids)
        scores: list[Any] = []
        for start in range(0, len(ids), self.batch_size):
            scores += self._yes_probabilities(ids[start:start + self.batch_size])
        return scores

    def _generate_and_parse(self, ids: list[list[int]]) -> list[Any]:
        from rllib_grpo.samplers import SamplingParams

        params = SamplingParams(temperature=0.0, max_tokens=self.max_tokens)
        groups = self._sampler.generate(ids, 1, params)
        scores: list[Any] = []
        for group in groups:
            text = self.tokenizer.decode(group[0].token_ids, skip_special_tokens=True)
            try:
                scores.append(self.rule.parse(text))
            except ValueError as err:
                scores.append(err)
        return scores

    def _yes_probabilities(self, ids: list[list[int]]) -> list[float]:
        import torch

        width = max(len(row) for row in ids)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in ids])  # left padding
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in ids])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        with torch.inference_mode():
            logits = self._model(input_ids=input_ids, attention_mask=mask,
                                 position_ids=positions).logits[:, -1]
        return yes_probability(logits, self._yes, self._no)


class RewardWorker:
    """One reward actor: a reward model or a local judge (module docstring)."""

    def __init__(self, spec: RewardSpec, *, dtype: str, batch_size: int, seed: int = 0,
                 run_id: str | None = None, index: int = 0) -> None:
        if run_id:  # the run's deadlines can show this process's stack
            enable_stack_dumps(run_id, f"reward worker {spec.name}[{index}] "
                                       f"({type(self).__name__})")
        path = resolve_model(str(spec.source))
        self.kind = spec.kind
        self.core: Any
        if spec.kind == "model":
            self.core = SequenceClassifierReward(path, dtype=dtype, batch_size=batch_size)
        else:
            self.core = LocalJudge(path, spec.options, dtype=dtype, batch_size=batch_size,
                                   seed=seed)
        self.num_batches = 0
        self.num_samples = 0

    def ready(self) -> int:
        """The actor's process id, once it is up."""
        return os.getpid()

    def score(self, prompts: Sequence[Any], responses: Sequence[str],
              ground_truths: Sequence[Any]) -> list[Any]:
        """Scores of one env-runner batch, in order."""
        self.num_batches += 1
        self.num_samples += len(responses)
        if self.kind == "model":  # a classifier reads the conversation only
            return self.core.score(prompts, responses)
        return self.core.score(prompts, responses, ground_truths)

    def stats(self) -> dict[str, int]:
        """Batches and samples scored since the actor (re)started, and its pid."""
        return {"num_batches": self.num_batches, "num_samples": self.num_samples,
                "pid": os.getpid()}


class RewardActors:
    """The reward actors of one algorithm: started before its env runners, stopped with it."""

    def __init__(self, prefix: str, actors: dict[str, list[Any]]) -> None:
        self.prefix = prefix
        self.actors = actors  # reward name -> actor handles

    @classmethod
    def start(cls, config: Any, placement: RunPlacement | None = None) -> RewardActors | None:
        """Start the pools the config's rewards need, each actor in its seat of the run's
        ``placement`` (None: wherever Ray schedules it), and record their name prefix on the
        (frozen) config for the env runners; None when no reward runs on actors.  Called
        within the algorithm's start-up deadline (``startup_timeout_s``,
        `rllib_grpo.rllib.algorithm.deadlines.Deadlines.startup`), which names a worker
        that is never placed or never loads its model."""
        import ray

        specs = actor_specs(config)
        if not specs:
            return None
        prefix = f"rllib_grpo.rewards.{uuid.uuid4().hex[:12]}"
        # The config is frozen once the algorithm exists; the prefix is no setting of the
        # user's, only where this run's actors are found, so it bypasses the freeze.
        object.__setattr__(config, REWARD_ACTOR_PREFIX, prefix)
        worker = ray.remote(RewardWorker)
        seats = iter(placement.plan.seats_of(REWARD_WORKER) if placement is not None else [])
        actors: dict[str, list[Any]] = {}
        for spec in specs:
            actors[spec.name] = []
            for i, name in enumerate(actor_names(prefix, spec, config.num_reward_workers)):
                where = (placement.options(next(seats)) if placement is not None else
                         {"num_cpus": 1, "num_gpus": config.num_gpus_per_reward_worker})
                actors[spec.name].append(worker.options(
                    name=name, max_restarts=-1, max_task_retries=0, **where).remote(
                        spec, dtype=reward_dtype(config), batch_size=config.reward_batch_size,
                        seed=(config.seed or 0) + i,
                        run_id=getattr(config, RUN_ID_ATTRIBUTE, None), index=i))
        handles = [h for pool in actors.values() for h in pool]
        # A model that does not load fails here.  (No deadline of its own: the start-up's
        # names what is missing, with the cluster's or the placement group's free room.)
        ray.get([h.ready.remote() for h in handles])
        logger.info("started %d reward actor(s) for %s", len(handles), ", ".join(actors))
        return cls(prefix, actors)

    def stop(self) -> None:
        """Kill every reward actor (no restart)."""
        import ray

        for pool in self.actors.values():
            for handle in pool:
                try:
                    ray.kill(handle, no_restart=True)
                except Exception:  # noqa: BLE001, S110 - already gone
                    pass
        self.actors = {}
