"""`make demo` / `make demo-real`: a real GRPO run on CPU that visibly learns.

``--model demo`` (default, ``make demo``): the built-in demo model (``builtin:demo``, see
`rllib_grpo.models.demo_model`) is a small character-level transformer given one second of
supervised warm-up on arithmetic demonstrations: it starts with about a third of its
sampled answers right, so groups mix right and wrong answers and GRPO has a signal from
the first step; GRPO then raises the reward to 0.9 and above.

``--model smollm2-135m`` (``make demo-real``): SmolLM2-135M-Instruct learns one-digit
sums asked as a chat question; held-out accuracy is printed before and after.

``--task tool-arithmetic|guess-number`` picks a multi-turn demo instead
(`rllib_grpo.demo.catalog.TASKS`); ``--model FOLDER`` trains a saved model instead of the
task's built-in one.

    python -m rllib_grpo.demo [--model demo|smollm2-135m|FOLDER] [--iterations N]
                              [--out DIR] [--sampler auto|vllm|hf] [--verbose]
                              [--task arithmetic|tool-arithmetic|guess-number]

The console shows one line per step (a progress bar with ETA on a terminal), then where
the plot, the TensorBoard logs, the checkpoint and the exported model (a Hugging Face
folder, which ``rllib-grpo eval`` scores) are."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from rllib_grpo.demo.catalog import DEMOS, TASKS, DemoSpec, demo_config, pick_demo

__all__ = ["demo_config", "heldout_accuracy", "heldout_report", "main", "plot_curve",
           "time_split"]

TIMING_KEYS = {"gen": ("env_runners", "timing_s/gen"), "reward_fn": ("env_runners",
               "timing_s/reward"), "update_actor": ("timing_s/update_actor",),
               "update_weights": ("timing_s/update_weights",), "time": ("timing_s/step",)}


def plot_curve(history: list[dict], path: Path, title: str,
               heldout: tuple[dict, dict] | None = None) -> None:
    """Reward per step; held-out accuracy (greedy and sampled) before and after as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["iteration"] for h in history]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [h["reward"] for h in history], label="mean reward (critic/score/mean)")
    if heldout is not None:
        ends = [0, steps[-1] if steps else 0]
        for kind, color in (("greedy", "tab:red"), ("sampled", "tab:green")):
            ax.plot(ends, [heldout[0][kind], heldout[1][kind]], "o--", color=color,
                    label=f"held-out accuracy, {kind}")
    ax.set_xlabel("training step")
    ax.set_ylabel("reward / accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def time_split(rows: list[dict]) -> str:
    """Mean per-phase seconds of an iteration over ``rows`` (verl's timing_s names)."""
    mean = {k: sum(r[k] for r in rows) / len(rows) for k in TIMING_KEYS}
    other = mean["time"] - mean["gen"] - mean["reward_fn"] - mean["update_actor"] \
        - mean["update_weights"]
    return (f"one step ({mean['time']:.3f}s, mean of the last {len(rows)}): "
            f"gen {mean['gen']:.3f}s, reward {mean['reward_fn']:.3f}s, "
            f"update_actor {mean['update_actor']:.3f}s, update_weights "
            f"{mean['update_weights']:.3f}s, driver/other {other:.3f}s")


def heldout_accuracy(algo: Any, temperature: float) -> float:
    """Mean accuracy on the config's held-out prompts (``val_env_config``: the first
    ``val_num_prompts`` of the held-out order, ``val_n`` samples each at ``temperature``),
    the same prompts at every call, through the local env runner."""
    import numpy as np

    from rllib_grpo.samplers import SamplingParams

    c = algo.config
    params = SamplingParams(temperature=temperature, max_tokens=c.max_response_length)
    samples = algo.env_runner_group.local_env_runner.evaluate(
        c.val_num_prompts, c.val_n, params, start=0)
    return float(np.mean([s.acc if s.acc is not None else s.score for s in samples]))


def heldout_report(algo: Any) -> dict[str, float]:
    """Held-out accuracy greedy (``val_temperature``) and as sampled in training."""
    c = algo.config
    return {"greedy": heldout_accuracy(algo, c.val_temperature),
            "sampled": heldout_accuracy(algo, c.temperature)}


def _row(result: dict) -> dict:
    def get(*path: str) -> float:
        node: Any = result
        for part in path:
            node = node.get(part, {}) if isinstance(node, dict) else {}
        return node if isinstance(node, int | float) else float("nan")

    row = {name: get(*path) for name, path in TIMING_KEYS.items()}
    row.update(iteration=result["training_iteration"], reward=get("critic/score/mean"))
    return row


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rllib_grpo.demo",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="demo", metavar="|".join((*sorted(DEMOS), "FOLDER")),
                        help="demo: the built-in 0.1M model (about a minute); smollm2-135m: "
                             "SmolLM2-135M-Instruct (a few minutes on a 2-core CPU); or a "
                             "saved model folder to train instead of the task's built-in")
    parser.add_argument("--task", default="arithmetic", choices=("arithmetic", *TASKS),
                        help="a multi-turn task instead of one-digit sums")
    parser.add_argument("--iterations", type=int, default=None,
                        help="training steps (default: the demo's own)")
    parser.add_argument("--target-reward", type=float, default=None,
                        help="stop early once the mean reward of the last 10 steps reaches "
                             "this (default: the demo's own)")
    parser.add_argument("--out", default="demo_output")
    parser.add_argument("--sampler", default="auto", choices=["auto", "vllm", "hf"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verbose", action="store_true",
                        help="show vLLM/Ray/transformers logs as they print them")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    from rllib_grpo.logs import quiet_console

    quiet_console(verbose=args.verbose)  # before vLLM/transformers/torch are imported
    try:
        spec: DemoSpec = pick_demo(args.model, args.task)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    iterations = args.iterations if args.iterations is not None else spec.iterations
    target = args.target_reward if args.target_reward is not None else spec.target_reward

    import logging

    import ray

    from rllib_grpo.rllib.algorithm.local_ray import init_local_ray

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    config = spec.build_config(args.seed, args.sampler)
    # A Ray of its own (address="local"), even when a `ray start` cluster runs here; the
    # algorithm's imports (and vLLM's) run while it starts.
    init_local_ray(config, num_cpus=2, object_store_memory=500 * 1024**2,
                   log_to_driver=False, configure_logging=args.verbose,
                   logging_level=logging.INFO if args.verbose else logging.WARNING)
    _prepare_model(config.model_path)
    algo = config.build_algo()
    print(f"ready in {time.perf_counter() - t_start:.1f}s: {config.model_path} on "
          f"{config.env}, {config.prompts_per_step} prompts x {config.group_size} samples "
          f"per step, up to {iterations} steps", flush=True)
    before = heldout_report(algo) if spec.heldout else None
    if before is not None:
        print(f"held-out accuracy before training ({config.val_num_prompts} prompts): "
              f"{before['greedy']:.3f} greedy, {before['sampled']:.3f} sampled at "
              f"temperature {config.temperature:g}", flush=True)
    history = _train(algo, iterations, target, out)
    after = heldout_report(algo) if spec.heldout else None
    _finish(algo, spec, history, out, t_start,
            (before, after) if before is not None and after is not None else None)
    algo.stop()
    ray.shutdown()
    return 0


def _prepare_model(name: str) -> None:
    """Build a built-in model into the cache now, saying so (the first run only)."""
    from rllib_grpo.models.model_registry import needs_build, resolve_model

    if needs_build(name):
        print(f"preparing {name} (first run only; cached for the next ones)...", flush=True)
        t0 = time.perf_counter()
        path = resolve_model(name)
        print(f"prepared {name} in {time.perf_counter() - t0:.0f}s: {path}", flush=True)


def _train(algo: Any, iterations: int, target: float | None, out: Path) -> list[dict]:
    from rllib_grpo.cli.console import Progress
    from rllib_grpo.cli.tensorboard import TensorBoardLogger

    tb = TensorBoardLogger(str(out / "tensorboard"), completions_every=5)
    progress = Progress(iterations)
    history: list[dict] = []
    try:
        for _ in range(iterations):
            result = algo.train()
            history.append(_row(result))
            tb.log(result, history[-1]["iteration"],
                   infos=algo.last_rollout.infos if algo.last_rollout else None)
            progress.update(result)
            recent = [h["reward"] for h in history[-10:]]
            if target is not None and len(recent) == 10 and sum(recent) / 10 >= target:
                break
    finally:
        progress.close()
        tb.close()
    return history


def _finish(algo: Any, spec: DemoSpec, history: list[dict], out: Path, t_start: float,
            heldout: tuple[dict, dict] | None) -> None:
    plot = out / "reward_curve.png"
    plot_curve(history, plot, spec.title, heldout)
    checkpoint = algo.save_to_path(str(out / "checkpoint"))
    exported = algo.export_model(str(out / "model"), overwrite=True)
    n = min(10, len(history))
    first = sum(h["reward"] for h in history[:n]) / n
    last = sum(h["reward"] for h in history[-n:]) / n
    print(f"mean reward of the first/last {n} steps: {first:.3f} -> {last:.3f} "
          f"({len(history)} steps, {time.perf_counter() - t_start:.0f}s in all)")
    if heldout is not None:
        before, after = heldout
        print(f"held-out accuracy: greedy {before['greedy']:.3f} -> {after['greedy']:.3f}, "
              f"sampled {before['sampled']:.3f} -> {after['sampled']:.3f} (before -> after)")
    print(time_split(history[-n:]))
    print(f"reward curve:   {plot}")
    print(f"TensorBoard:    tensorboard --logdir {out / 'tensorboard'}")
    print(f"checkpoint:     {checkpoint}")
    print(f"exported model: {exported}")
    if spec.eval_args:
        print(f"score it:       rllib-grpo eval {exported} {spec.eval_args}")


if __name__ == "__main__":
    raise SystemExit(main())
