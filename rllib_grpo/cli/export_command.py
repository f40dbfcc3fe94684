"""``rllib-grpo export CHECKPOINT OUT_DIR``: a checkpoint's policy as a Hugging Face model folder.

    rllib-grpo export demo_output/checkpoint /tmp/demo_model
    rllib-grpo export CKPT OUT --dtype bfloat16          # weights cast for serving
    rllib-grpo export LORA_CKPT OUT --adapter-only       # PEFT adapter folder instead of a merge

Reads the checkpoint's files (`rllib_grpo.cli.checkpoint`; no Ray cluster) and writes
them with `rllib_grpo.models.export`.  From Python: `export_checkpoint` here, or
``algo.export_model(dir)`` on a running `GRPO`.
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.checkpoint import CheckpointError, read_checkpoint
from rllib_grpo.cli.errors import ConfigError

if TYPE_CHECKING:
    from rllib_grpo.models.export import ExportedModel

# As rllib_grpo.models.export has them; repeated so that `--help` imports no torch.
DEFAULT_MAX_SHARD_SIZE = "5GB"
EXPORT_DTYPES = ("bfloat16", "float16", "float32")

EXPORT_EPILOG = """\
the folder holds config.json, generation_config.json, safetensors shards and the base
model's tokenizer files (chat template included): transformers' from_pretrained, vLLM
and the Hub tooling load it. A LoRA checkpoint is merged into its base model unless
--adapter-only asks for a PEFT adapter folder (adapter_config.json names the base).

examples:
  rllib-grpo export demo_output/checkpoint /tmp/demo_model
  rllib-grpo export ~/ray_results/GRPO_x/checkpoint_000001 /tmp/model --dtype bfloat16
  rllib-grpo export lora_ckpt /tmp/adapter --adapter-only

exit codes: 0 written, 2 bad input (no checkpoint there, OUT_DIR not empty, ...).
"""


def add_export_parser(sub: Any) -> None:
    """The ``export`` sub-command."""
    p = sub.add_parser(
        "export", help="write a checkpoint's policy as a Hugging Face model folder",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=EXPORT_EPILOG,
        description="Write the policy of a GRPO checkpoint (any number of learners, FSDP or\n"
                    "not, LoRA or not) as a standard model folder. No Ray cluster is needed.")
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="algorithm checkpoint folder (algo.save_to_path, a Tune checkpoint_*)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to write (new or empty)")
    p.add_argument("--dtype", choices=EXPORT_DTYPES,
                   help="dtype of the written weights (default: as the learner held them)")
    lora = p.add_mutually_exclusive_group()
    lora.add_argument("--merge-lora", dest="lora_mode", action="store_const", const="merge",
                      help="LoRA: merge the adapter into the base weights (the default)")
    lora.add_argument("--adapter-only", dest="lora_mode", action="store_const", const="adapter",
                      help="LoRA: write the PEFT adapter folder instead of a merged model")
    p.add_argument("--max-shard-size", default=DEFAULT_MAX_SHARD_SIZE, metavar="SIZE",
                   help=f"largest safetensors file, e.g. 2GB (default {DEFAULT_MAX_SHARD_SIZE})")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty OUT_DIR")
    p.set_defaults(lora_mode="merge")


def export_checkpoint(
    checkpoint: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: str | None = None,
    lora_mode: str = "merge",
    max_shard_size: str | int = DEFAULT_MAX_SHARD_SIZE,
    overwrite: bool = False,
) -> ExportedModel:
    """Write the policy of the GRPO checkpoint at ``checkpoint`` as a model folder.

    ``lora_mode``: ``"merge"`` or ``"adapter"`` (LoRA checkpoints only); ``dtype``
    None keeps the learner's.  Raises `CheckpointError` (a ValueError) when
    ``checkpoint`` is not a readable GRPO checkpoint.
    """
    from rllib_grpo.models.export import export_module_state

    ckpt = read_checkpoint(checkpoint)
    if lora_mode == "adapter" and not ckpt.is_lora:
        raise CheckpointError(f"{checkpoint}: --adapter-only needs a LoRA checkpoint "
                              "(lora_rank > 0); this one holds the full weights")
    return export_module_state(
        ckpt.load_module_state(), ckpt.base_model, out_dir, dtype=dtype, lora_mode=lora_mode,
        base_dtype=ckpt.model_dtype, max_shard_size=max_shard_size, overwrite=overwrite)


def run_export(args: argparse.Namespace) -> int:
    """``rllib-grpo export``: bad input raises `ConfigError` (exit 2)."""
    if not os.path.isdir(args.checkpoint):
        raise ConfigError(f"{args.checkpoint}: no such checkpoint folder")
    try:
        exported = export_checkpoint(args.checkpoint, args.out_dir, dtype=args.dtype,
                                     lora_mode=args.lora_mode,
                                     max_shard_size=args.max_shard_size,
                                     overwrite=args.overwrite)
    except (CheckpointError, FileExistsError, ValueError) as err:
        raise ConfigError(str(err)) from None
    print(f"exported {exported.describe()}")
    return 0
