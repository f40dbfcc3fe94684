"""GRPO whose only reward is a reward model (docs/reward-models.md).

    python examples/reward_model_demo.py [--iterations 30] [--json out.json] [--plot out.png]

The reward model, ``builtin:demo-rm``, is trained in code in seconds (Bradley-Terry on
pairs; `rllib_grpo.models.reward_models`) to prefer arithmetic answers that are *even
numbers*.  The policy is the tiny demo model (``builtin:demo``), which answers sums.  GRPO
with ``reward_funcs=["builtin:demo-rm"]`` - the model on its own Ray actor, one call per
env-runner batch - raises the reward model's score of greedy answers to held-out prompts,
and the share of answers that are even.  Printed per iteration: the training reward (the
model's mean score), the held-out score, the even share, and the seconds the step waited
on the reward model (``timing_s/reward/demo-rm``) against the step time.
"""

from __future__ import annotations

import argparse
import json
import statistics

import ray

from rllib_grpo import GRPOConfig
from rllib_grpo.models.reward_models import is_even_answer
from rllib_grpo.samplers import SamplingParams

RM = "builtin:demo-rm"
RM_NAME = "builtin_demo-rm"


def demo_config(seed: int = 0, sampler: str = "hf") -> GRPOConfig:
    """The demo's GRPOConfig: the arithmetic demo with the reward model as its only reward."""
    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(model_path="builtin:demo", prompts_per_step=16, group_size=8,
                  max_prompt_length=16, max_response_length=4, lr=1e-3, use_kl_loss=True,
                  kl_loss_coef=0.001, sampler=sampler, reward_funcs=[RM],
                  # Held out: sums of operands up to 9 (training sees up to 4).
                  val_env_config={"max_operand": 9})
        .debugging(seed=seed)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False)
    algo = demo_config(args.seed).build_algo()
    rows = []
    try:
        for iteration in range(args.iterations + 1):
            row = {"iteration": iteration, **evaluate_held_out(algo)}
            if iteration < args.iterations:
                result = algo.train()
                runners = result["env_runners"]
                row.update(train_rm_mean=runners[f"reward/{RM_NAME}/mean"],
                           rm_seconds=runners[f"timing_s/reward/{RM_NAME}"],
                           step_seconds=result["timing_s/step"])
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        algo.stop()
        ray.shutdown()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


def evaluate_held_out(algo, num_prompts: int = 64) -> dict[str, float]:
    """Greedy answers to ``num_prompts`` held-out prompts (the validation env: other sums,
    most never trained on): the reward model's mean score and
    the share of answers that are even numbers (the form it prefers)."""
    runner = algo.env_runner_group.local_env_runner
    env = runner._validation_env()
    prompts = [runner._next_prompt(env) for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    outputs = runner.sampler.generate([p["prompt_token_ids"] for p in prompts], 1, params)
    scored = runner._score_many(env, [(p, out[0].token_ids)
                                      for p, out in zip(prompts, outputs, strict=True)])
    env.seek(0)  # the same held-out prompts at every evaluation
    answers = [i["response"].strip() for i in scored]
    return {"held_out_rm_score": statistics.fmean(float(i["reward"]) for i in scored),
            "held_out_even_share": statistics.fmean(map(is_even_answer, answers)),
            "held_out_correct_share": statistics.fmean(
                a == str(p["ground_truth"]) for a, p in zip(answers, prompts, strict=True))}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    its = [r["iteration"] for r in rows]
    left.plot(its, [r["held_out_rm_score"] for r in rows], label="held-out RM score (greedy)")
    trained = [r for r in rows if "train_rm_mean" in r]
    left.plot([r["iteration"] + 1 for r in trained], [r["train_rm_mean"] for r in trained],
              label="training reward (RM mean, sampled)", alpha=0.7)
    left.set_xlabel("training step")
    left.set_ylabel("reward model score")
    left.legend()
    right.plot(its, [r["held_out_even_share"] for r in rows], label="even answers")
    right.plot(its, [r["held_out_correct_share"] for r in rows], label="correct sums")
    right.set_xlabel("training step")
    right.set_ylabel("share of held-out answers")
    right.set_ylim(0, 1)
    right.legend()
    fig.suptitle("GRPO whose only reward is a reward model (builtin:demo-rm: prefers even "
                 "answers)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
