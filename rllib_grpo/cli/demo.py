"""`make demo`: a real GRPO run on CPU that visibly learns.

The built-in demo model (``builtin:demo``, see `rllib_grpo.models.demo`) is a
small character-level transformer given one second of supervised warm-up on
arithmetic demonstrations: it starts with about a third of its sampled answers
right, so groups mix right and wrong answers and GRPO has a signal from the
first step; GRPO then raises the reward to 0.9 and above.  The run ends with a
checkpoint and the final policy exported as a Hugging Face model folder
(``<out>/model``), which ``rllib-grpo eval`` scores.

    python -m rllib_grpo.demo [--iterations N] [--out DIR] [--sampler auto|vllm|hf]
                              [--task arithmetic|tool-arithmetic|guess-number]

``--task`` picks a multi-turn demo instead (`rllib_grpo.cli.demo_agents`).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from rllib_grpo.cli.demo_agents import TASKS, multi_turn_progress, task_config
from rllib_grpo.cli.tensorboard import TensorBoardLogger

# `rllib-grpo eval` arguments that score a model on the demo's task.
EVAL_ARGS = ("--env rllib_grpo/Arithmetic-v0 --env-config '{\"max_operand\": 4}' "
             "--max-response-length 4")


def demo_config(seed: int = 0, sampler: str = "auto"):
    """The demo's GRPOConfig (also used by the learning test)."""
    from rllib_grpo.rllib.config import GRPOConfig

    return (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(
            model_path="builtin:demo",
            prompts_per_step=16, group_size=8,
            max_prompt_length=16, max_response_length=4,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001,
            sampler=sampler,
        )
        .debugging(seed=seed)
    )


def plot_curve(history: list[dict], path: Path, task: str = "Arithmetic-v0") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["iteration"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward"] for h in history], label="mean reward (critic/score/mean)")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"GRPO on rllib_grpo/{task} (CPU demo)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def time_split(rows: list[dict]) -> str:
    """Mean per-phase seconds of an iteration over ``rows`` (verl's timing_s names)."""
    mean = {k: sum(r[k] for r in rows) / len(rows)
            for k in ("time", "gen", "reward_fn", "update_actor", "update_weights")}
    other = mean["time"] - mean["gen"] - mean["reward_fn"] - mean["update_actor"] \
        - mean["update_weights"]
    return (f"one step ({mean['time']:.3f}s, mean of the last {len(rows)}): "
            f"gen {mean['gen']:.3f}s, reward {mean['reward_fn']:.3f}s, "
            f"update_actor {mean['update_actor']:.3f}s, update_weights "
            f"{mean['update_weights']:.3f}s, driver/other {other:.3f}s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--target-reward", type=float, default=0.9,
                        help="stop early once the mean reward of the last 10 steps reaches this")
    parser.add_argument("--out", default="demo_output")
    parser.add_argument("--sampler", default="auto", choices=["auto", "vllm", "hf"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--task", default="arithmetic", choices=("arithmetic", *TASKS))
    parser.add_argument("--model", default=None,
                        help="a model folder instead of the task's built-in (multi-turn tasks)")
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")

    import ray

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2, include_dashboard=False,
             log_to_driver=False, configure_logging=False)
    if args.task == "arithmetic":
        config = demo_config(args.seed, args.sampler)
        if args.model:
            config.training(model_path=args.model)
    else:
        config = task_config(args.task, args.seed, args.sampler, args.model)
    algo = config.build_algo()
    print(f"built in {time.perf_counter() - t_start:.1f}s; training "
          f"(logs: {out / 'tensorboard'})", flush=True)
    tb = TensorBoardLogger(str(out / "tensorboard"), completions_every=5)
    history: list[dict] = []
    for _ in range(args.iterations):
        result = algo.train()
        it = result["training_iteration"]
        runners = result.get("env_runners", {})
        row = {
            "iteration": it,
            "gen": runners.get("timing_s/gen", float("nan")),
            "reward_fn": runners.get("timing_s/reward", float("nan")),
            "update_actor": result.get("timing_s/update_actor", float("nan")),
            "update_weights": result.get("timing_s/update_weights", float("nan")),
            "reward": result.get("critic/score/mean", float("nan")),
            "length": result.get("response_length/mean", float("nan")),
            "kl": result.get("actor/kl_loss", float("nan")),
            "time": result.get("timing_s/step", float("nan")),
        }
        history.append(row)
        tb.log(result, it, infos=algo.last_rollout.infos if algo.last_rollout else None)
        print(f"iter {it:3d}  reward {row['reward']:.3f}  response_len {row['length']:.2f}  "
              f"kl {row['kl']:.4f}  step {row['time']:.2f}s{multi_turn_progress(result)}",
              flush=True)
        recent = [h["reward"] for h in history[-10:]]
        if len(recent) == 10 and sum(recent) / 10 >= args.target_reward:
            break
    tb.close()
    plot_curve(history, out / "reward_curve.png", algo.config.env.split("/")[-1])
    checkpoint = algo.save_to_path(str(out / "checkpoint"))
    model_dir = algo.export_model(str(out / "model"), overwrite=True)
    first = sum(h["reward"] for h in history[:10]) / min(10, len(history))
    last = sum(h["reward"] for h in history[-10:]) / min(10, len(history))
    print(f"mean reward of the first/last 10 steps: {first:.3f} -> {last:.3f} "
          f"({len(history)} steps, "
          f"{time.perf_counter() - t_start:.0f}s in all)")
    print(time_split(history[-10:]))
    print(f"reward curve: {out / 'reward_curve.png'}")
    print(f"final checkpoint: {checkpoint}")
    print(f"exported model (transformers / vLLM folder): {model_dir}")
    print(f"score it: rllib-grpo eval {model_dir} {EVAL_ARGS}")
    algo.stop()
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
