"""``rllib-grpo eval MODEL_OR_CHECKPOINT --data PATH | --env ID``: verl's validation metrics.

    rllib-grpo eval builtin:demo --env rllib_grpo/Arithmetic-v0 --env-config '{"max_operand": 4}'
    rllib-grpo eval demo_output/checkpoint            # the env and lengths the run trained with
    rllib-grpo eval /models/qwen --data val.parquet --n 16 --temperature 0.6 --out qwen.json

MODEL_OR_CHECKPOINT is a model folder, a built-in model name, a Hugging Face hub id or a
GRPO checkpoint (exported to a temporary folder first, `rllib_grpo.cli.export_command`).  Every
input is checked before a model loads; bad ones exit 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.checkpoint import Checkpoint, CheckpointError, is_checkpoint, read_checkpoint
from rllib_grpo.cli.errors import ConfigError

if TYPE_CHECKING:
    from rllib_grpo.cli.evaluate import EvalResult, EvalSettings

DEFAULT_ENV_PROMPTS = 256  # generated tasks hold thousands of problems
MAX_DEFAULT_RESPONSE = 1024
SAMPLER_KINDS = ("auto", "vllm", "hf")  # rllib_grpo.samplers's; repeated: `--help` loads no torch
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")

EVAL_EPILOG = f"""\
prompts: every prompt of --data; the first {DEFAULT_ENV_PROMPTS} of --env (--num-prompts to change).
A checkpoint without --data/--env is scored on the env it trained on (with its
val_env_config) at its max_response_length.

metrics (verl's names): val-core/<source>/acc/mean@N, best@N/mean, maj@N/mean (when the
reward reports a prediction), pass@k/mean for k = 1, 2, 4, ..., N (unbiased estimator),
response_length/mean and clip_ratio. Printed, and written to --out as JSON with a few
sampled completions.

examples:
  rllib-grpo eval builtin:demo --env rllib_grpo/Arithmetic-v0 --env-config '{{"max_operand": 4}}'
  rllib-grpo eval demo_output/model --env rllib_grpo/Arithmetic-v0 --env-config '{{"max_operand": 4}}'
  rllib-grpo eval ~/ray_results/GRPO_x/checkpoint_000010 --n 16 --out ckpt10.json

exit codes: 0 done, 2 bad input (no such model or checkpoint, unknown env, bad data file).
"""


def add_eval_parser(sub: Any) -> None:
    """The ``eval`` sub-command."""
    p = sub.add_parser(
        "eval", help="score a model folder or checkpoint on prompts (verl's val-core metrics)",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EVAL_EPILOG,
        description="Sample N responses per prompt (vLLM, transformers as the fallback), score\n"
                    "them with the env's reward function and report verl's validation metrics.")
    p.add_argument("model", metavar="MODEL_OR_CHECKPOINT",
                   help="model folder, built-in name (builtin:demo), hub id, or GRPO checkpoint")
    source = p.add_mutually_exclusive_group()
    source.add_argument("--data", metavar="PATH", help="prompt file (.jsonl/.json/.parquet, "
                        "verl's format too); rewards dispatch on each row's data_source")
    source.add_argument("--env", metavar="ID", help="text env id, e.g. rllib_grpo/GSM8K-v0")
    p.add_argument("--env-config", metavar="JSON", help="keyword arguments of the env (JSON)")
    p.add_argument("--reward", metavar="NAME", help="reward function for --data (default: by "
                   "data_source)")
    p.add_argument("--n", type=int, default=8, help="responses per prompt (default 8)")
    p.add_argument("--temperature", type=float, default=1.0, help="default 1.0")
    p.add_argument("--top-p", type=float, default=1.0, help="default 1.0")
    p.add_argument("--max-response-length", type=int, metavar="TOKENS",
                   help="default: the checkpoint's, else what the model's positions allow "
                        f"(at most {MAX_DEFAULT_RESPONSE})")
    p.add_argument("--num-prompts", type=int, metavar="N", help="score the first N prompts")
    p.add_argument("--sampler", choices=SAMPLER_KINDS, default="auto",
                   help="auto (vLLM, else transformers), vllm or hf")
    p.add_argument("--dtype", choices=["float32", "bfloat16", "float16", "auto"],
                   help="sampling dtype (default float32 on CPU, auto on GPU)")
    p.add_argument("--seed", type=int, default=0, help="sampling and env seed (default 0)")
    p.add_argument("--batch-size", type=int, default=128, metavar="PROMPTS",
                   help="prompts per generate call (default 128)")
    p.add_argument("--out", default="eval_results.json", metavar="JSON",
                   help="where to write the results (default eval_results.json)")


# ----------------------------------------------------------------------------- inputs
def _check_numbers(args: argparse.Namespace) -> None:
    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    if args.temperature < 0:
        raise ConfigError(f"--temperature must be >= 0, got {args.temperature}")
    if not 0 < args.top_p <= 1:
        raise ConfigError(f"--top-p must be in (0, 1], got {args.top_p}")
    for flag in ("max_response_length", "num_prompts", "batch_size"):
        value = getattr(args, flag)
        if value is not None and value < 1:
            raise ConfigError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def classify_model(arg: str) -> tuple[str, Checkpoint | None]:
    """``(model folder, built-in name or hub id; checkpoint or None)``; ConfigError if none."""
    from rllib_grpo.models.model_registry import builtin_model_names

    path = Path(arg).expanduser()
    if path.is_dir():
        if is_checkpoint(path):
            try:
                return str(path), read_checkpoint(path)
            except CheckpointError as err:
                raise ConfigError(str(err)) from None
        if (path / "config.json").is_file():
            return str(path), None
        raise ConfigError(f"{arg}: neither a GRPO checkpoint nor a model folder (no config.json)")
    if arg in builtin_model_names():
        return arg, None
    if path.exists():
        raise ConfigError(f"{arg}: a file; expected a model folder or a checkpoint folder")
    if HUB_ID.match(arg) and not arg.startswith("."):
        try:
            from transformers import AutoConfig

            AutoConfig.from_pretrained(arg)
        except Exception as err:  # noqa: BLE001  (offline, unknown id, no access: all one answer)
            raise ConfigError(f"{arg}: no such folder, and not loadable as a hub id "
                              f"({type(err).__name__})") from None
        return arg, None
    raise ConfigError(f"{arg}: no such model folder or checkpoint (built-in models: "
                      f"{', '.join(builtin_model_names())})")


def env_spec(args: argparse.Namespace, ckpt: Checkpoint | None) -> dict[str, Any]:
    """What env to build: ``{"data": path}`` or ``{"env": id, "env_config": {...}}``."""
    try:
        env_config = json.loads(args.env_config) if args.env_config else {}
    except json.JSONDecodeError as err:
        raise ConfigError(f"--env-config is not JSON: {err}") from None
    if not isinstance(env_config, dict):
        raise ConfigError("--env-config must be a JSON object, e.g. '{\"max_operand\": 4}'")
    if args.data:
        if not Path(args.data).is_file():
            raise ConfigError(f"--data {args.data}: no such file")
        return {"data": args.data, "env_config": env_config}
    if args.reward:
        raise ConfigError("--reward applies to --data; an env brings its own reward")
    if args.env:
        env_id = args.env
    elif ckpt is not None and isinstance(ckpt.setting("env"), str):
        env_id = ckpt.setting("env")
        env_config = {**dict(ckpt.setting("env_config") or {}),
                      **dict(ckpt.setting("val_env_config") or {}), **env_config}
    else:
        raise ConfigError("what to score on: give --data PATH or --env ID")
    import gymnasium

    import rllib_grpo  # noqa: F401  (registers the built-in env ids)

    if env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if k.startswith("rllib_grpo/"))
        raise ConfigError(f"unknown env {env_id!r}; the built-in text envs: {', '.join(known)}")
    return {"env": env_id, "env_config": env_config}


def build_env(spec: dict[str, Any], args: argparse.Namespace, tokenizer: Any,
              ckpt: Checkpoint | None) -> Any:
    """The `TextEnv` to score on (prompt-length settings from the checkpoint, if any)."""
    from rllib_grpo.envs.text import TextEnv

    kwargs: dict[str, Any] = {"tokenizer": tokenizer, "seed": args.seed}
    if ckpt is not None and ckpt.setting("max_prompt_length"):
        kwargs.update(max_prompt_length=ckpt.setting("max_prompt_length"),
                      truncation=ckpt.setting("truncation", "error"))
    try:
        if "data" in spec:
            return TextEnv(spec["data"], reward_fn=args.reward, shuffle=False,
                           **{**kwargs, **spec["env_config"]})
        import gymnasium

        env = gymnasium.make(spec["env"], disable_env_checker=True,
                             **{**kwargs, **spec["env_config"]}).unwrapped
    except (ValueError, TypeError, KeyError, OSError) as err:
        # gymnasium appends the (multi-line) kwargs to the env's own message: keep the latter.
        reason = str(err).split(" was raised from the environment creator")[0].splitlines()
        raise ConfigError(f"cannot build the env: {reason[0] if reason else err!r}") from None
    if not isinstance(env, TextEnv):
        raise ConfigError(f"{spec['env']} is a {type(env).__name__}, not a text env")
    return env


def response_budget(args: argparse.Namespace, ckpt: Checkpoint | None, model_dir: str,
                    env: Any, num_prompts: int) -> int:
    """``--max-response-length``, else the checkpoint's, else what the positions allow."""
    from transformers import AutoConfig

    positions = getattr(AutoConfig.from_pretrained(model_dir).get_text_config(),
                        "max_position_embeddings", None)
    longest = max(len(env.reset(options={"index": i})[1]["prompt_token_ids"])
                  for i in range(num_prompts))
    wanted = args.max_response_length or (ckpt.setting("max_response_length") if ckpt else None)
    if wanted is None:
        return max(1, min(MAX_DEFAULT_RESPONSE, (positions or 10**9) - longest))
    if positions and longest + wanted > positions:
        raise ConfigError(f"--max-response-length {wanted} + the longest prompt ({longest} "
                          f"tokens) exceeds the model's {positions} positions")
    return int(wanted)


# ----------------------------------------------------------------------------- run
def run_eval(args: argparse.Namespace) -> int:
    """``rllib-grpo eval``: check every input, sample, score, print and write JSON."""
    from rllib_grpo.cli.evaluate import EvalSettings, settings_dict

    _check_numbers(args)
    model, ckpt = classify_model(args.model)
    spec = env_spec(args, ckpt)
    # vLLM's start-up warnings (seeds, eager mode, CPU tuning) say nothing about the scores.
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    with tempfile.TemporaryDirectory(prefix="rllib-grpo-eval-") as scratch:
        model_dir = _model_folder(model, ckpt, scratch)
        from rllib_grpo.models.tokenizers import load_tokenizer

        tokenizer = load_tokenizer(model_dir)
        env = build_env(spec, args, tokenizer, ckpt)
        default_prompts = DEFAULT_ENV_PROMPTS if "env" in spec else None
        num_prompts = min(args.num_prompts or default_prompts or env.num_prompts,
                          env.num_prompts)
        settings = EvalSettings(
            n=args.n, temperature=args.temperature, top_p=args.top_p,
            max_response_length=response_budget(args, ckpt, model_dir, env, num_prompts),
            num_prompts=num_prompts, sampler=args.sampler, dtype=_sampling_dtype(args.dtype),
            seed=args.seed, batch_size=args.batch_size)
        result = _run_with_progress(model_dir, env, settings, tokenizer)
    context = {"model": args.model, **{k: v for k, v in spec.items() if v}, **{
        "settings": settings_dict(settings)}}
    print_result(result, context)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result.to_json(**context), indent=2, default=str) + "\n")
    print(f"results: {Path(args.out).resolve()}")
    return 0


def _model_folder(model: str, ckpt: Checkpoint | None, scratch: str) -> str:
    """A folder the samplers load: the model itself, or the checkpoint exported to ``scratch``."""
    from rllib_grpo.models.model_registry import resolve_model

    if ckpt is None:
        return resolve_model(model)
    from rllib_grpo.models.export import export_module_state

    try:
        exported = export_module_state(ckpt.load_module_state(), ckpt.base_model,
                                       Path(scratch, "model"), base_dtype=ckpt.model_dtype)
    except (CheckpointError, ValueError) as err:
        raise ConfigError(f"{model}: {err}") from None
    return exported.path


def _sampling_dtype(dtype: str | None) -> str:
    if dtype:
        return dtype
    import torch

    return "auto" if torch.cuda.is_available() else "float32"


def _run_with_progress(model_dir: str, env: Any, settings: EvalSettings,
                       tokenizer: Any) -> EvalResult:
    from tqdm import tqdm

    from rllib_grpo.cli.evaluate import evaluate

    # Shown on a terminal only: redirected output stays free of carriage-return lines.
    with tqdm(total=settings.num_prompts, unit="prompt", desc=f"eval n={settings.n}",
              file=sys.stderr, disable=None) as bar:
        return evaluate(model_dir, env, settings, tokenizer=tokenizer, progress=bar.update)


def print_result(result: EvalResult, context: dict[str, Any]) -> None:
    """Metrics one per line, then the first sampled completions."""
    what = context.get("data") or f"{context.get('env')} {context.get('env_config') or ''}"
    print(f"{context['model']} on {what.strip()}: {result.num_prompts} prompts x "
          f"{context['settings']['n']} samples in {result.seconds:.1f}s")
    width = max((len(k) for k in result.metrics), default=0)
    for key, value in result.metrics.items():
        print(f"  {key:<{width}}  {value:.4f}")
    for sample in result.samples[:3]:
        print(f"  sample: {sample['prompt']!r} -> {sample['response']!r} (ground truth "
              f"{sample['ground_truth']!r}, score {sample['score']:g})")
