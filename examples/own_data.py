"""Your own prompts and reward function (the README's Python example; docs/training.md).

A JSONL file with one ``{"prompt", "answer", "data_source"}`` row per line (or verl's parquet)
and a reward function ``score(data_source, solution_str, ground_truth, extra_info)`` that
returns a float (or a dict with ``score`` and optionally ``acc``).  Chat prompts (a list
of ``{"role", "content"}`` messages) are rendered with the model's chat template.

    python examples/own_data.py [--model smollm2-135m] [--iterations 10]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import ray

from rllib_grpo import GRPOConfig
from rllib_grpo.envs.text import TextEnv

REWARD_FILE = '''\
def score(data_source, solution_str, ground_truth, extra_info=None):
    """1 for the right sum as the first word of the response, else 0."""
    words = solution_str.split()
    return float(bool(words) and words[0] == ground_truth)
'''


def write_task(folder: Path) -> tuple[str, str]:
    """A prompt file and a reward file, as a user would write them."""
    data = folder / "train.jsonl"
    rows = [{"prompt": f"{a}+{b}=", "answer": str(a + b), "data_source": "my_sums"}
            for a in range(5) for b in range(5)]
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    reward = folder / "my_reward.py"
    reward.write_text(REWARD_FILE)
    return str(data), f"{reward}:score"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--model", default="builtin:demo")
    parser.add_argument("--sampler", default="auto", choices=["auto", "vllm", "hf"])
    args = parser.parse_args()
    data, reward_fn = write_task(Path(tempfile.mkdtemp(prefix="rllib_grpo_own_data_")))

    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False)
    # -- the README's example -------------------------------------------------------------
    config = (
        GRPOConfig()
        .environment(TextEnv, env_config={"dataset": data, "reward_fn": reward_fn})
        .training(model_path=args.model, prompts_per_step=8, group_size=4,
                  max_prompt_length=16, max_response_length=4, lr=1e-3,
                  sampler=args.sampler)
    )
    algo = config.build_algo()
    for _ in range(args.iterations):
        result = algo.train()
        print(f"iter {result['training_iteration']}  reward {result['critic/score/mean']:.3f}")
    # ----------------------------------------------------------------------------------
    algo.stop()
    ray.shutdown()


if __name__ == "__main__":
    main()
