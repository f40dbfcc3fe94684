"""The learner on padded vs packed (padding-free) rows, interleaved in one process.

    python -m benchmarks.packing [--model builtin:tiny|builtin:10m|...] [--prompts 8]
        [--group-size 4] [--response-length 32] [--rollouts 3] [--repeats 10]
        [--micro-batch-size N | --token-budget T] [--json out.json]

Samples ``--rollouts`` real rollouts with the package's env runner (built in this
process, no Ray) from the model *with*
its end-of-sequence token (responses end where the model stops: the padded batch pads
them to the longest), then times the learner's update of each rollout
(``GRPOLearner.update``: old log-prob pass, reference pass, advantages, mini-batch update)
under each variant, from the same weights and a fresh optimizer every time:

* ``padded``: ``use_remove_padding=False``, ``skip_old_log_prob_pass=False`` (as before);
* ``packed``: ``use_remove_padding=True`` (the old-log-prob pass still runs);
* ``packed+shortcut``: the package's defaults (the on-policy step takes the old
  log-probs from the update's own forward).

The variants run round-robin, ``--repeats`` times over every rollout, so load drift on
a shared machine hits them alike; the phases are the learner's own ``timing_s/*``
metrics and the report gives medians over the repeats, summed over the rollouts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS: dict[str, dict[str, bool]] = {
    "padded": {"use_remove_padding": False, "skip_old_log_prob_pass": False},
    "packed": {"use_remove_padding": True, "skip_old_log_prob_pass": False},
    "packed+shortcut": {"use_remove_padding": True, "skip_old_log_prob_pass": True},
}
PHASES = ("old_log_prob", "ref", "update_policy")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="builtin:tiny")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--response-length", type=int, default=32)
    p.add_argument("--rollouts", type=int, default=3, help="different sampled batches")
    p.add_argument("--repeats", type=int, default=10, help="timed updates per variant and rollout")
    p.add_argument("--micro-batch-size", type=int, default=None)
    p.add_argument("--token-budget", type=int, default=None,
                   help="use_dynamic_bsz with this max_tokens_per_micro_batch")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    return p.parse_args(argv)


def _learner_config(base: Any, variant: dict[str, bool], args: argparse.Namespace) -> Any:
    config = base.copy(copy_frozen=False)
    config.training(**variant)
    if args.token_budget:
        config.training(use_dynamic_bsz=True, max_tokens_per_micro_batch=args.token_budget)
    return config


def _timed_update(learner: Any, batch: Any, start: dict, config: Any) -> dict[str, float]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    learner.config = config
    learner.module[DEFAULT_MODULE_ID].lm.load_state_dict(start)
    for optim in learner._named_optimizers.values():
        optim.state.clear()
    wall = time.perf_counter()
    results = learner.update(batch=batch)[DEFAULT_MODULE_ID]
    wall = time.perf_counter() - wall

    def value(key: str) -> float:
        stat = results.get(key, 0.0)
        return float(stat.peek() if hasattr(stat, "peek") else stat)

    out = {phase: value(f"timing_s/{phase}") for phase in PHASES}
    out["learner"] = sum(out.values())
    out["learner_update_call"] = wall
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from ray.rllib.core import DEFAULT_MODULE_ID
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch

    from benchmarks.common import Workload, token_counts
    from benchmarks.rllib_run import build_config
    from benchmarks.workloads import prepare_model
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner

    torch.set_num_threads(args.threads)
    w = Workload(model=args.model, prompts=args.prompts, group_size=args.group_size,
                 response_length=args.response_length, micro_batch_size=args.micro_batch_size,
                 threads=args.threads, fixed_length=False)
    w.model_dir = prepare_model(w.model, fixed_length=False)
    base = build_config(w)
    base.validate()
    # The package's env runner and learner, built in this process without Ray.
    runner = TextEnvRunner(config=base)
    learner = base.build_learner(spaces={DEFAULT_MODULE_ID: (TEXT_SPACE, TEXT_SPACE)})
    start = {k: v.clone() for k, v in learner.module[DEFAULT_MODULE_ID].lm.state_dict().items()}
    rollouts = [runner.sample(num_prompts=w.prompts) for _ in range(args.rollouts)]
    runner.stop()
    batches = [MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(r.train_columns())}, len(r))
               for r in rollouts]
    counts = [token_counts(r.prompt_lengths, r.response_lengths, r.prompt_ids.shape[1],
                           r.response_ids.shape[1]) for r in rollouts]
    configs = {name: _learner_config(base, v, args) for name, v in VARIANTS.items()}
    torch.set_num_threads(args.threads)
    for config in configs.values():  # warm-up, unmeasured
        _timed_update(learner, batches[0], start, config)
    samples: dict[str, list[list[dict[str, float]]]] = {n: [[] for _ in batches]
                                                       for n in VARIANTS}
    names = list(VARIANTS)
    for repeat in range(args.repeats):
        order = names[repeat % len(names):] + names[:repeat % len(names)]  # rotate
        for index, batch in enumerate(batches):
            for name in order:
                samples[name][index].append(_timed_update(learner, batch, start, configs[name]))
    params = learner.module[DEFAULT_MODULE_ID].lm.num_parameters()
    medians = {name: {key: sum(statistics.median(s[key] for s in per_batch)
                                for per_batch in per_rollout)
                      for key in (*PHASES, "learner", "learner_update_call")}
               for name, per_rollout in samples.items()}
    real = sum(c["tokens"] for c in counts)
    padded = sum(c["padded_tokens"] for c in counts)
    return {
        "args": vars(args), "params": params, "real_tokens": real, "padded_tokens": padded,
        "padding_fraction": 1 - real / padded,
        "mean_response_length": statistics.mean(c["mean_response_length"] for c in counts),
        "medians_s": medians,  # per-repeat timings stay out: results/ keeps summaries
        "ratio_packed_over_padded": medians["packed"]["learner"] / medians["padded"]["learner"],
        "ratio_shortcut_over_padded": (medians["packed+shortcut"]["learner"]
                                       / medians["padded"]["learner"]),
    }


def format_report(report: dict[str, Any]) -> str:
    """Markdown: seconds per phase (medians, summed over the rollouts) and the ratios."""
    a = report["args"]
    lines = [f"{a['model']} ({report['params'] / 1e6:.2f}M params), {a['prompts']} prompts x "
             f"{a['group_size']}, responses <= {a['response_length']} tokens (mean "
             f"{report['mean_response_length']:.1f}), {a['rollouts']} rollouts x {a['repeats']} "
             f"repeats; padding {100 * report['padding_fraction']:.0f}% of the padded tokens "
             f"({report['real_tokens']:.0f} real of {report['padded_tokens']:.0f})", "",
             "| variant | old_log_prob | ref | update | learner (sum) | vs padded |",
             "|---|---:|---:|---:|---:|---:|"]
    base = report["medians_s"]["padded"]["learner"]
    for name, m in report["medians_s"].items():
        lines.append(f"| {name} | {m['old_log_prob']:.4f} s | {m['ref']:.4f} s | "
                     f"{m['update_policy']:.4f} s | {m['learner']:.4f} s | "
                     f"{m['learner'] / base:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = run(args)
    report["command"] = "python -m benchmarks.packing " + " ".join(
        sys.argv[1:] if argv is None else argv)
    print(format_report(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
