"""GRPO from Python: configure, train, checkpoint, restore.

    python examples/python_api.py [--iterations 30] [--model builtin:demo]
"""

from __future__ import annotations

import argparse

import ray

from rllib_grpo import GRPO, GRPOConfig


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--model", default="builtin:demo")
    parser.add_argument("--sampler", default="auto", choices=["auto", "vllm", "hf"])
    parser.add_argument("--out", default="/tmp/rllib_grpo_python_api")
    args = parser.parse_args()

    # address="local": a new Ray for this run, even where a `ray start` cluster is up.
    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False)
    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(
            model_path=args.model,
            prompts_per_step=16,          # prompts per training step (verl data.train_batch_size)
            group_size=8,                 # responses per prompt (verl rollout.n)
            max_prompt_length=16, max_response_length=4,
            lr=1e-3, use_kl_loss=True, kl_loss_coef=0.001, kl_loss_type="low_var_kl",
            loss_agg_mode="token-mean",
            sampler=args.sampler,
        )
        .debugging(seed=0)
    )
    print(config.explain())
    algo = config.build_algo()
    for _ in range(args.iterations):
        result = algo.train()
        print(f"iter {result['training_iteration']:3d}  "
              f"reward {result['critic/score/mean']:.3f}  "
              f"pg_loss {result['actor/pg_loss']:+.4f}  kl {result['actor/kl_loss']:.4f}")
    path = algo.save_to_path(args.out)
    algo.stop()

    restored = GRPO.from_checkpoint(path)
    print(f"restored at iteration {restored.training_iteration}; one more step: reward "
          f"{restored.train()['critic/score/mean']:.3f}")
    restored.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
