"""`EvaluatingAlgorithm`: GRPO's validation as RLlib's evaluation (a base class of `GRPO`).

RLlib's `Algorithm.evaluate` samples episodes from (evaluation) env runners and reads
their episode metrics; GRPO's env runners return groups of scored responses, so that
path cannot work.  Here `evaluate` scores the held-out set with the env runners'
`evaluate` and returns verl's ``val-core`` metrics; RLlib's own machinery around it is
kept: `_run_one_evaluation` (eval runner restarts and counts) puts them under
``result["evaluation"]``, the ``on_evaluate_start`` / ``on_evaluate_end`` callbacks fire,
and a user's ``custom_evaluation_function`` still replaces the whole thing.

One schedule serves RLlib's and verl's settings (`evaluation_due`): every
``evaluation_interval`` steps (``val_every``, verl's ``trainer.test_freq``, is the same
field) and the last step (``total_training_steps``); ``val_before_train`` adds one before
the first step.  ``evaluation_duration`` (``val_num_prompts``) counts held-out prompts;
unset, it scores the whole held-out set once (verl).  The sampling
settings are the evaluation config's (``evaluation_config={"val_n": 4, ...}``).

The validation runs on the training env runners (verl validates on its rollout
workers) unless ``evaluation_num_env_runners`` > 0 asks for runners of its own.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.env.env_runner_group import EnvRunnerGroup
from ray.rllib.utils.annotations import override
from ray.rllib.utils.metrics import EVALUATION_RESULTS
from ray.rllib.utils.typing import ModuleID, ResultDict

from rllib_grpo.data.recipes import pass_at_k_metrics, validation_metrics
from rllib_grpo.rllib.algorithm.resilience import ResilientAlgorithm
from rllib_grpo.rllib.algorithm.sampling.prompt_order import prompt_slices

logger = logging.getLogger(__name__)
# Evaluation metrics also surfaced at the top level of a result, where verl logs them.
VERL_VALIDATION_PREFIXES = ("val-core/", "timing_s/testing")


def evaluation_interval(config: Any) -> int:
    """Training steps between evaluations (``evaluation_interval``); 0 = never."""
    return max(0, int(config.evaluation_interval or 0))


def evaluation_due(config: Any, step: int) -> bool:
    """After training step ``step`` (1-based): every interval and at the last step
    (verl); never when the interval is 0."""
    interval = evaluation_interval(config)
    return interval > 0 and (step % interval == 0 or step == config.total_training_steps)


def evaluation_prompts(config: Any, set_size: int) -> int:
    """Held-out prompts one evaluation scores: ``evaluation_duration`` in prompts
    (``val_num_prompts``); unset: the whole set.  Never more than the set: a prompt scored
    twice would count as two samples of one prompt."""
    count = config.val_num_prompts
    if count is None:
        return set_size
    if count > set_size:
        logger.warning("Evaluation asked for %d prompts; the held-out set has %d, each "
                       "scored once.", count, set_size)
    return min(int(count), set_size)


class EvaluatingAlgorithm(ResilientAlgorithm):
    """An `Algorithm` whose evaluation is GRPO's validation (see the module docstring)."""

    @override(Algorithm)
    @classmethod
    def _should_create_evaluation_env_runners(cls, eval_config: Any) -> bool:
        """Runners of its own only when ``evaluation_num_env_runners`` > 0 (RLlib also
        builds a local one for ``evaluation_interval``: a second model copy)."""
        return eval_config.evaluation_num_env_runners > 0

    @override(Algorithm)
    def step(self) -> ResultDict:
        """RLlib's step (which evaluates every ``evaluation_interval``), plus verl's
        evaluation before the first step and at the last one."""
        before = self._run_one_evaluation() if (
            self.iteration == 0 and getattr(self.config, "val_before_train", False)) else {}
        results = super().step()
        if EVALUATION_RESULTS not in results and evaluation_due(self.config,
                                                                self.iteration + 1):
            results.update(self._run_one_evaluation())
        elif EVALUATION_RESULTS not in results and before:
            results.update(before)
        # verl's validation names also at the top level, where verl logs them.
        results.update({key: value for key, value in results.get(EVALUATION_RESULTS, {}).items()
                        if key.startswith(VERL_VALIDATION_PREFIXES)})
        return results

    @override(Algorithm)
    def evaluate(self, parallel_train_future: Any = None) -> ResultDict:
        """Score the held-out prompts; verl's ``val-core`` metrics (``mean@N``,
        ``best@N``, ``maj@N``, ``pass@k``; N = samples per prompt) and
        ``timing_s/testing``.  A ``custom_evaluation_function`` runs RLlib's path."""
        if self.config.custom_evaluation_function:
            return super().evaluate(parallel_train_future)
        self._before_evaluate()
        group = self.eval_env_runner_group
        if group is not None:  # runners of its own: give them the current weights
            group.sync_weights(from_worker_or_learner_group=self.learner_group,
                               inference_only=True)
        self._evaluate_callback("on_evaluate_start", {})
        metrics = self.validate(group)
        self._evaluate_callback("on_evaluate_end", {"evaluation_metrics": metrics})
        return metrics

    def _evaluate_callback(self, name: str, extra: dict) -> None:
        from ray.rllib.callbacks.utils import make_callback

        make_callback(name, callbacks_objects=self.callbacks,
                      callbacks_functions=getattr(self.config, f"callbacks_{name}"),
                      kwargs=dict(algorithm=self, metrics_logger=self.metrics, **extra))

    def validate(self, group: EnvRunnerGroup | None = None) -> dict[str, float]:
        """Score the held-out set (greedy by default) on ``group`` (default: the training
        env runners) and return verl's ``val-core`` metrics.

        Every validation scores the same prompts, the first of the held-out order (see
        `evaluation_prompts`), each once, split over the env runners.
        """
        c, group = self.evaluation_config, group or self.env_runner_group
        t0 = time.perf_counter()
        num_remote = group.num_remote_env_runners()
        params = c.validation_sampling()
        if num_remote == 0:
            runner = group.local_env_runner
            num_prompts = evaluation_prompts(c, runner.validation_set_size())
            with self.deadlines.watch("evaluate", "the local env runner (evaluation)",
                                      kill=False):
                samples = runner.evaluate(num_prompts, c.val_n, params, start=0)
        else:
            set_size = group.foreach_env_runner(lambda er: er.validation_set_size(),
                                                local_env_runner=False)[0]
            slices = prompt_slices(0, evaluation_prompts(c, set_size), num_remote)
            # A runner stuck past the deadline is restarted and its slice scored again
            # (a lost one's too), as in sampling.
            per_runner = self.sample_on_runners(
                lambda er, part: er.evaluate(part[1], c.val_n, params, start=part[0]),
                slices, phase="evaluate", call="evaluation", group=group)
            samples = [s for runner_samples in per_runner for s in runner_samples]
        metrics = {**validation_metrics(samples), **pass_at_k_metrics(samples)}
        metrics["timing_s/testing"] = time.perf_counter() - t0
        return metrics

    @override(Algorithm)
    def get_module(self, module_id: ModuleID | None = None) -> RLModule | None:
        """The policy's RLModule: the learner's (GRPO's env runners hold a sampler, not an
        RLModule).  With remote learners, a copy of learner rank 0's: a module built from
        the config's spec, loaded with its full state (gathered from every shard under
        FSDP)."""
        from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

        module_id = module_id or DEFAULT_MODULE_ID
        learner_group = self.learner_group
        if learner_group.is_local:
            module = learner_group._learner.module
            return module[module_id] if module_id in module else None
        spec = self.config.get_multi_rl_module_spec(spaces=self.spaces, inference_only=False)
        if module_id not in spec.rl_module_specs:
            return None
        state = learner_group.get_state(
            components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}/{module_id}",
        )[COMPONENT_LEARNER][COMPONENT_RL_MODULE][module_id]
        module = spec.rl_module_specs[module_id].build()
        module.set_state(state)
        return module
