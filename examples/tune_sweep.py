"""A Ray Tune sweep over learning rate and group size: 2 trials, a few iterations each.

    python examples/tune_sweep.py [--iterations 5] [--storage-path /tmp/grpo_tune]
"""

from __future__ import annotations

import argparse

import ray
from ray import tune

import rllib_grpo
from rllib_grpo import GRPOConfig
from rllib_grpo.cli.resume import ContinueTrialResults


def sweep_config(model: str, sampler: str) -> GRPOConfig:
    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(model_path=model, prompts_per_step=8, max_prompt_length=16,
                  max_response_length=4, sampler=sampler)
        .debugging(seed=0)
    )
    # Two trials: lr on a grid, the group size paired with it (4 with 1e-3, 8 with 3e-3).
    config.training(lr=tune.grid_search([1e-3, 3e-3]))
    config.group_size = tune.sample_from(lambda spec: 4 if spec.config.lr < 2e-3 else 8)
    return config


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--model", default="builtin:demo")
    parser.add_argument("--sampler", default="hf", choices=["auto", "vllm", "hf"])
    parser.add_argument("--storage-path", default="/tmp/rllib_grpo_tune")
    args = parser.parse_args()

    # address="local": a new Ray for this run, even where a `ray start` cluster is up.
    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False)
    rllib_grpo.register()  # "GRPO" by name for Tune (or pass the class: config.algo_class)
    tuner = tune.Tuner(
        "GRPO",
        param_space=sweep_config(args.model, args.sampler),
        tune_config=tune.TuneConfig(metric="critic/score/mean", mode="max"),
        run_config=tune.RunConfig(
            storage_path=args.storage_path,
            stop={"training_iteration": args.iterations},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
            # Each iteration once in result.json / progress.csv across a resume
            # (tune.Tuner.restore) or a retry: docs/training.md, "Interrupt, resume".
            callbacks=[ContinueTrialResults()],
        ),
    )
    results = tuner.fit()
    for result in results:
        print(f"lr={result.config['lr']:.0e} group_size={result.config['group_size']}: "
              f"reward {result.metrics['critic/score/mean']:.3f}  "
              f"checkpoint {result.checkpoint.path}")
    best = results.get_best_result()
    print(f"best: lr={best.config['lr']:.0e} group_size={best.config['group_size']}")
    ray.shutdown()


if __name__ == "__main__":
    main()
