"""The measured processes of `benchmarks.trl`: TRL's GRPOTrainer and ours.

    python -m benchmarks.trl_runs --system trl|vllm|hf --spec JSON --spawn-ts T --out PATH

Each run is a fresh process doing the same workload (`SideBySideSpec`): the same model
folder, the same ``rllib_grpo/Arithmetic-v0`` prompts, the same reward function
(`rllib_grpo.rewards.score_arithmetic`), ``prompts x group_size`` responses of exactly
``max_new_tokens`` tokens (the model has no end-of-sequence token, as in
`benchmarks.step`; ``fixed_length=False`` keeps it), temperature 1, fp32 (``precision="bf16"``:
bf16 compute over fp32 master weights), KL coefficient ``beta`` (0: no reference
model), AdamW at ``lr``, one optimizer step per generation batch, ``threads`` torch
threads.  ``trl`` runs under the benchmark's own Python (``benchmarks/.venv-trl``, which
has TRL); ``vllm`` and ``hf`` are `GRPOConfig` (``num_learners=0``, ``num_env_runners=0``)
with that sampler.

The run writes, as JSON: the wall-clock time at which its first step began (the parent
subtracts the spawn time it passed in), and the ``perf_counter`` at the begin and end of
every step: TRL's from a ``TrainerCallback`` (``on_step_begin`` / ``on_step_end``), ours
around each ``algo.train()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from typing import Any

SYSTEMS = ("trl", "vllm", "hf")
# --workload -> (model name for benchmarks.workloads.prepare_model, Arithmetic prompt style).
# The character model has no chat template (its prompts are "3+4="); SmolLM2's chat
# prompts are 43 tokens each with its template (single-digit operands: all the same length).
WORKLOADS = {"5m7": ("builtin:qwen2-5m7", "plain"), "smollm2": ("smollm2-135m", "chat")}
MAX_OPERAND = 9
# --precision: fp32 compute, or bf16 compute over fp32 master weights (TRL's bf16=True,
# its default: autocast; ours: model_dtype="bfloat16").
PRECISIONS = ("fp32", "bf16")


@dataclasses.dataclass
class SideBySideSpec:
    """One workload, identical for every system."""

    workload: str = "5m7"
    beta: float = 0.0
    steps: int = 8
    warmup: int = 2
    prompts: int = 8
    group_size: int = 4
    max_new_tokens: int = 32
    max_prompt_length: int = 64
    temperature: float = 1.0
    lr: float = 1e-6
    threads: int = 1
    seed: int = 0
    precision: str = "fp32"  # `PRECISIONS`
    # True: every response runs to max_new_tokens (the same work in every system); False:
    # responses end at the model's EOS, as sampled (lengths differ by chance; reported).
    fixed_length: bool = True
    model_dir: str = ""      # what every system samples from: with fixed_length, the copy
    tokenizer_dir: str = ""  # without EOS; tokenizer_dir: the original (TRL needs an EOS)

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def prompt_style(self) -> str:
        return WORKLOADS[self.workload][1]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def arithmetic_reward(completions: list[Any], ground_truth: list[Any],
                      **_: Any) -> list[float]:
    """TRL reward function: `score_arithmetic` (the env's reward) of each completion."""
    from rllib_grpo.rewards import score_arithmetic

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score_arithmetic(text, truth)["score"]
            for text, truth in zip(texts, ground_truth, strict=True)]


class StepClock:
    """Step begin/end times; the wall-clock time of the first begin."""

    def __init__(self) -> None:
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.first_step_wall: float | None = None
        self.completion_lengths: list[float] = []

    def begin(self) -> None:
        if self.first_step_wall is None:
            self.first_step_wall = time.time()
        self.begins.append(time.perf_counter())

    def end(self) -> None:
        self.ends.append(time.perf_counter())

    def to_json(self) -> dict[str, Any]:
        return {"step_begin": self.begins, "step_end": self.ends,
                "first_step_wall": self.first_step_wall,
                "completion_lengths": self.completion_lengths}


def run_trl(spec: SideBySideSpec) -> dict[str, Any]:
    """``GRPOTrainer.train()`` for ``spec.total_steps`` optimizer steps, timed by a callback."""
    import tempfile

    import torch
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rllib_grpo.envs.arithmetic import make_arithmetic_records
    from rllib_grpo.models import load_tokenizer

    torch.set_num_threads(spec.threads)
    clock = StepClock()
    clipped: list[float] = []

    class Clock(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None,
                           **kw: Any) -> None:
            # Trainer.train() copied the tokenizer's EOS into the model's configs
            # (transformers' align_special_tokens) just before this: undo it.
            if spec.fixed_length:
                _without_eos(model)

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            clock.end()

        def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None,
                   **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                clock.completion_lengths.append(float(logs["completions/mean_length"]))
                # Share of completions whose last token is not EOS/pad: ~1 when generation
                # ran to max_new_tokens (a random model emits pad as often as any token).
                clipped.append(float(logs.get("completions/clipped_ratio", float("nan"))))

    records = make_arithmetic_records(spec.total_steps * spec.prompts, spec.seed,
                                      max_operand=MAX_OPERAND, prompt_style=spec.prompt_style)
    dataset = Dataset.from_list([{"prompt": r.prompt, "ground_truth": r.ground_truth}
                                 for r in records])
    tokenizer = load_tokenizer(spec.tokenizer_dir)
    tokenizer.padding_side = "left"  # what TRL's own AutoProcessor call asks for
    output_dir = tempfile.mkdtemp(prefix="trl_side_by_side_")
    args = GRPOConfig(
        output_dir=output_dir, per_device_train_batch_size=spec.prompts * spec.group_size,
        gradient_accumulation_steps=1, steps_per_generation=1, num_iterations=1,
        num_generations=spec.group_size, max_completion_length=spec.max_new_tokens,
        temperature=spec.temperature, beta=spec.beta, learning_rate=spec.lr,
        max_steps=spec.total_steps, use_cpu=True, bf16=spec.precision == "bf16", fp16=False,
        gradient_checkpointing=False, model_init_kwargs={"dtype": "float32"},
        report_to="none", logging_steps=1, save_strategy="no", disable_tqdm=True,
        dataloader_num_workers=0, seed=spec.seed,
    )
    trainer = GRPOTrainer(model=spec.model_dir, reward_funcs=arithmetic_reward, args=args,
                          train_dataset=dataset, processing_class=tokenizer,
                          callbacks=[Clock()])
    # Fixed length, as in ours: the model folder has no EOS (so generate never stops early)
    # and TRL must not cut completions at the tokenizer's EOS id either.
    if spec.fixed_length:
        trainer.eos_token_ids = []
        trainer.generation_config.eos_token_id = None
        trainer.generation_kwargs["eos_token_id"] = None
    torch.set_num_threads(spec.threads)
    trainer.train()
    params = trainer.model.num_parameters()
    return {**clock.to_json(), "params": params, "torch_threads": torch.get_num_threads(),
            "trl_version": trl.__version__, "clipped_ratio": clipped}


def _without_eos(model: Any) -> None:
    """No end-of-sequence token in the model's configs (generation runs to max_new_tokens)."""
    model.generation_config.eos_token_id = None
    model.config.get_text_config().eos_token_id = None


def build_ours(spec: SideBySideSpec, sampler: str) -> Any:
    """The `GRPOConfig` of the workload with ``sampler``: local learner and env runner."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0",
                     env_config={"max_operand": MAX_OPERAND, "prompt_style": spec.prompt_style})
        .training(
            model_path=spec.model_dir, prompts_per_step=spec.prompts,
            group_size=spec.group_size, max_prompt_length=spec.max_prompt_length,
            max_response_length=spec.max_new_tokens, temperature=spec.temperature,
            use_kl_loss=spec.beta > 0, kl_loss_coef=spec.beta, lr=spec.lr, sampler=sampler,
            model_dtype="bfloat16" if spec.precision == "bf16" else "float32",
        )
        .env_runners(num_env_runners=0)
        .learners(num_learners=0)
        .debugging(seed=spec.seed)
    )


def run_ours(spec: SideBySideSpec, sampler: str) -> dict[str, Any]:
    """``algo.train()`` ``spec.total_steps`` times, each timed."""
    import ray
    import torch

    from rllib_grpo.rllib.algorithm.local_ray import init_local_ray

    torch.set_num_threads(spec.threads)
    config = build_ours(spec, sampler)
    # As the demo starts Ray: its own, no idle workers, the run's imports meanwhile.
    init_local_ray(config, num_cpus=max(2, os.cpu_count() or 2),
                   object_store_memory=500 * 1024**2, log_to_driver=False,
                   configure_logging=False)
    algo = config.build_algo()
    torch.set_num_threads(spec.threads)  # whatever the build did
    clock = StepClock()
    timings: list[dict[str, float]] = []
    try:
        for _ in range(spec.total_steps):
            clock.begin()
            result = algo.train()
            clock.end()
            lengths = algo.last_rollout.response_lengths
            clock.completion_lengths.append(float(sum(lengths)) / max(len(lengths), 1))
            timings.append({k: float(v) for k, v in result.items()
                            if k.startswith("timing_s/") and isinstance(v, int | float)})
        params = _num_parameters(algo)
    finally:
        algo.stop()
        ray.shutdown()
    return {**clock.to_json(), "params": params, "timing_s": timings,
            "torch_threads": torch.get_num_threads()}


def _num_parameters(algo: Any) -> int:
    from ray.rllib.core import DEFAULT_MODULE_ID

    return int(algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
               .lm.num_parameters())


RUNNERS: dict[str, Callable[[SideBySideSpec], dict[str, Any]]] = {
    "trl": run_trl,
    "vllm": lambda spec: run_ours(spec, "vllm"),
    "hf": lambda spec: run_ours(spec, "hf"),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--system", choices=SYSTEMS, required=True)
    p.add_argument("--spec", required=True, help="SideBySideSpec as JSON")
    p.add_argument("--spawn-ts", type=float, required=True,
                   help="time.time() in the parent just before it started this process")
    p.add_argument("--out", required=True, help="where to write the JSON result")
    args = p.parse_args(argv)
    started = time.time()
    spec = SideBySideSpec(**json.loads(args.spec))
    result = RUNNERS[args.system](spec)
    result.update(system=args.system, spawn_ts=args.spawn_ts, process_start_wall=started,
                  pid=os.getpid())
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
