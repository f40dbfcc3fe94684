"""Score a model folder or a checkpoint on prompts: verl's validation metrics, outside training.

`evaluate` samples ``n`` responses per prompt with a `rllib_grpo.samplers` sampler
(vLLM, or transformers where vLLM does not import), scores each with the text
env's reward function, and returns verl's ``val-core`` metrics
(`rllib_grpo.data.recipes.validation_metrics`: ``acc/mean@N``, ``best@N/mean``,
``maj@N/mean``) plus ``pass@k`` by the unbiased estimator, response-length
statistics and a few completions.  The command line is `rllib_grpo.cli.eval_command`.

Prompts are the first ``num_prompts`` of the env's dataset, in dataset order, so two
models (before and after training) are scored on the same prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from rllib_grpo.data.recipes import ValidationSample, pass_at_k_metrics, validation_metrics
from rllib_grpo.envs.text import TextEnv
from rllib_grpo.samplers import SamplingParams, make_sampler

NUM_SHOWN_SAMPLES = 5


@dataclass
class EvalSettings:
    """How to sample.  ``num_prompts`` None: every prompt of the env."""

    n: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    max_response_length: int = 512
    num_prompts: int | None = None
    sampler: str = "auto"
    dtype: str = "float32"
    seed: int = 0
    batch_size: int = 128  # prompts per generate call (and per progress-bar tick)


@dataclass
class EvalResult:
    """Metrics by verl's names, a few completions, and how long it took."""

    metrics: dict[str, float]
    samples: list[dict[str, Any]]
    num_prompts: int
    seconds: float

    def to_json(self, **context: Any) -> dict[str, Any]:
        return {**context, "num_prompts": self.num_prompts, "seconds": round(self.seconds, 3),
                "metrics": self.metrics, "samples": self.samples}


def evaluate(
    model_dir: str,
    env: TextEnv,
    settings: EvalSettings,
    *,
    tokenizer: Any,
    progress: Callable[[int], None] | None = None,
    sampler: Any = None,
) -> EvalResult:
    """Sample and score ``settings.n`` responses for each of the env's first prompts.

    ``progress(k)`` is called after each batch of ``k`` prompts; ``sampler`` reuses an
    engine (else one is made from ``model_dir`` and closed at the end).
    """
    start = time.perf_counter()
    total = env.num_prompts if settings.num_prompts is None else min(settings.num_prompts,
                                                                      env.num_prompts)
    own_sampler = sampler is None
    if own_sampler:
        engine: dict[str, Any] = ({} if settings.sampler == "hf"
                                  else {"kv_cache_space_gb": 1})  # vLLM on CPU
        sampler = make_sampler(settings.sampler, model_path=model_dir, dtype=settings.dtype,
                               seed=settings.seed, **engine)
    params = SamplingParams(temperature=settings.temperature, top_p=settings.top_p,
                            max_tokens=settings.max_response_length)
    samples: list[ValidationSample] = []
    shown: list[dict[str, Any]] = []
    lengths: list[int] = []
    truncated = 0
    try:
        for first in range(0, total, settings.batch_size):
            prompts = [_prompt(env, i) for i in range(first, min(first + settings.batch_size,
                                                                   total))]
            groups = sampler.generate([p["prompt_token_ids"] for p in prompts], settings.n,
                                      params)
            for prompt, group in zip(prompts, groups, strict=True):
                for j, sample in enumerate(group):
                    text = tokenizer.decode(sample.token_ids, skip_special_tokens=True)
                    info = _score(env, prompt["index"], text)
                    samples.append(ValidationSample(
                        prompt_index=prompt["index"], data_source=str(prompt["data_source"]),
                        score=float(info["score"]),
                        acc=None if info.get("acc") is None else float(info["acc"]),
                        pred=info.get("pred"), has_pred="pred" in info))
                    lengths.append(len(sample.token_ids))
                    truncated += sample.finish_reason == "length"
                    if j == 0 and len(shown) < NUM_SHOWN_SAMPLES:
                        shown.append({"prompt": prompt["text"], "response": text,
                                      "ground_truth": prompt["ground_truth"],
                                      "score": float(info["score"]), "acc": info.get("acc"),
                                      "pred": info.get("pred")})
            if progress is not None:
                progress(len(prompts))
    finally:
        if own_sampler and hasattr(sampler, "close"):
            sampler.close()
    metrics = {**validation_metrics(samples), **pass_at_k_metrics(samples)}
    if lengths:
        metrics["response_length/mean"] = sum(lengths) / len(lengths)
        metrics["response_length/clip_ratio"] = truncated / len(lengths)
    ordered = sorted(metrics.items(), key=lambda kv: (not kv[0].startswith("val-core/"), kv[0]))
    return EvalResult(dict(ordered), shown, total,
                      time.perf_counter() - start)


def _prompt(env: TextEnv, index: int) -> dict[str, Any]:
    observation, info = env.reset(options={"index": index})
    if "prompt_token_ids" not in info:
        raise ValueError("the env renders no prompt token ids: build it with tokenizer=...")
    return {"text": observation, **info}


def _score(env: TextEnv, index: int, text: str) -> dict[str, Any]:
    env.reset(options={"index": index})
    _, reward, _, _, info = env.step(text)
    return {**info, "score": float(reward)}


def settings_dict(settings: EvalSettings) -> dict[str, Any]:
    """The settings as the JSON output records them."""
    return asdict(settings)
