"""Memory levers and the memory estimate that `explain` prints.

Levers (settings block "LoRA and memory"):

* ``gradient_checkpointing``: recompute activations in the backward pass;
* ``use_dynamic_bsz`` + ``max_tokens_per_micro_batch``: micro-batches to a token
  budget, which bounds activations and logits;
* ``lora_rank``: only the adapter has gradients and AdamW states, and the
  reference is the policy with the adapter disabled (no copy);
* ``ref_param_offload``: the reference model lives in host memory and visits the
  learner's device once per reference pass (`HostOffloaded`; a no-op on CPU); under FSDP
  each learner keeps its shard in host memory and each layer visits for its forward;
* ``optimizer_offload``: AdamW states in host memory between optimizer steps
  (`offload_optimizer_states`, hooks on the optimizer that GRPOLearner installs;
  a no-op on CPU);
* ``fsdp`` with >= 2 learners shards weights, gradients, AdamW states and the
  reference (``fsdp_cpu_offload`` moves the shards to host memory);
* ``sampler_memory_fraction``: vLLM's ``gpu_memory_utilization``.

The estimate (`estimate_memory`) reads the model's shape from its ``config.json``
(parameters counted on the meta device, so nothing is allocated) and adds, per
learner: the master weights, their gradients and two AdamW states in
``master_weights_dtype`` (fp32 by default, as verl's FSDP; with LoRA the frozen base
is in ``model_dtype`` and peft keeps the adapter in fp32), divided by the learners
under FSDP; with bf16 compute over fp32 master weights, the compute copy of the
weights (autocast caches every cast weight through forward and backward on one
learner; FSDP2 holds the all-gathered root and about two decoder layers in bf16);
the reference copy in ``model_dtype`` (none with LoRA); activations of one
micro-batch (tokens x hidden x layers x `ACTIVATION_VALUES` values, Korthikanti
et al. 2022 without the attention-score term, which SDPA/flash attention do not
store; with gradient checkpointing one value per layer plus one layer's full
set); and the logits of one micro-batch in fp32 (tokens x vocab x 4 bytes; the
loss holds a few such tensors for a moment).  Per sampler: weights plus the KV
cache of every sequence of a generation call at full length (capped by vLLM's
``max_num_seqs``), or the engine's configured share of the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.vision_plan import vision_memory_rows

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ACTIVATION_VALUES = 17  # stored activations per token, per hidden unit, per layer
VLLM_MAX_NUM_SEQS = 256  # vLLM's default max_num_seqs
ADAPTER_BYTES = 4  # peft keeps adapters in fp32 (autocast_adapter_dtype)


# --------------------------------------------------------------------------- model shape
@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs from a causal LM's config."""

    num_params: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_kv_heads: int
    head_dim: int
    lora_params: int = 0  # trainable parameters of the configured adapter


def model_shape(path: str, lora_rank: int = 0, target_modules: Any = "all-linear"
                ) -> ModelShape:
    """Shape and parameter counts of the model in ``path`` (a folder or a cached hub id)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(path, local_files_only=True)
    text = config.get_text_config()
    vision = getattr(config, "vision_config", None) is not None  # its tower counts too
    with torch.device("meta"):
        model = (AutoModelForImageTextToText if vision else AutoModelForCausalLM).from_config(
            config)
    heads = text.num_attention_heads
    return ModelShape(
        num_params=sum(p.numel() for p in model.parameters()),
        hidden_size=text.hidden_size, num_layers=text.num_hidden_layers,
        vocab_size=text.vocab_size,
        num_kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads,
        lora_params=lora_param_count(model, lora_rank, target_modules),
    )


def lora_param_count(model: torch.nn.Module, rank: int, target_modules: Any) -> int:
    """``rank x (in + out)`` over the linear layers peft would adapt."""
    if rank <= 0:
        return 0
    head = model.get_output_embeddings()  # type: ignore[operator]
    names = None if target_modules == "all-linear" else (
        {target_modules} if isinstance(target_modules, str) else set(target_modules))
    total = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        if names is None or name.rpartition(".")[2] in names or name in names:
            total += rank * (module.in_features + module.out_features)
    return total


# --------------------------------------------------------------------------- estimate
@dataclass
class MemoryEstimate:
    """Bytes per learner and per sampler, by row, with notes on the assumptions."""

    shape: ModelShape
    learner: dict[str, float]
    sampler: dict[str, float]
    notes: list[str]

    @property
    def learner_total(self) -> float:
        return sum(self.learner.values())

    @property
    def sampler_total(self) -> float:
        return sum(self.sampler.values())


def micro_batch_tokens(c: GRPOSettings) -> int:
    """Tokens of one learner micro-batch at full length (the activation/logit driver)."""
    if c.use_dynamic_bsz:
        return c.max_tokens_per_micro_batch
    micro = max(1, c.batch_plan().micro_batch_size_per_learner)
    return micro * (c.max_prompt_length + c.max_response_length)


def compute_copy_bytes(c: GRPOSettings, shape: ModelShape, shards: int) -> float:
    """Bytes of the weights' compute-dtype copy when it differs from the master dtype: all
    of them on one learner (autocast's cache), the root and ~2 layers under FSDP2."""
    compute, master = DTYPE_BYTES[c.compute_dtype], DTYPE_BYTES[c.master_weights_dtype]
    if c.lora_rank > 0 or compute >= master:
        return 0.0
    if shards == 1:
        return float(shape.num_params * compute)
    root = shape.vocab_size * shape.hidden_size
    per_layer = max(shape.num_params - root, 0) / max(shape.num_layers, 1)
    return float((root + 2 * per_layer) * compute)


def learner_memory(c: GRPOSettings, shape: ModelShape) -> tuple[dict[str, float], list[str]]:
    """Device bytes of one learner, by row, and notes."""
    dtype_bytes = DTYPE_BYTES[c.compute_dtype]  # compute: reference, activations, LoRA base
    learners = c.batch_plan().num_learners
    shards = learners if (c.fsdp and learners >= 2) else 1
    host_shards = shards > 1 and c.fsdp_cpu_offload
    lora = c.lora_rank > 0
    trainable = shape.lora_params if lora else shape.num_params
    train_bytes = ADAPTER_BYTES if lora else DTYPE_BYTES[c.master_weights_dtype]
    notes = []
    weights = shape.num_params * dtype_bytes + trainable * train_bytes if lora \
        else shape.num_params * train_bytes
    rows = {
        "weights": weights / shards,
        "gradients": trainable * train_bytes / shards,
        "optimizer (AdamW)": 2 * trainable * train_bytes / shards,
        "reference model": 0.0 if lora or not (c.use_kl_loss or c.use_kl_in_reward)
        else shape.num_params * dtype_bytes / shards,
    }
    copy = compute_copy_bytes(c, shape, shards)
    if copy:
        rows[f"compute copy ({c.compute_dtype})"] = copy
        notes.append(f"{c.master_weights_dtype} master weights and AdamW states, "
                     f"{c.compute_dtype} compute")
    if host_shards:
        rows.update({"weights": 0.0, "gradients": 0.0, "optimizer (AdamW)": 0.0})
        notes.append("fsdp_cpu_offload: weights, gradients and AdamW states in host memory")
    if c.optimizer_offload and rows["optimizer (AdamW)"]:
        notes.append("optimizer_offload: AdamW states in host memory except during the step")
        rows["optimizer (AdamW)"] = 0.0
    if c.ref_param_offload and rows["reference model"]:
        notes.append("ref_param_offload: the reference visits the device for its forward only")
        rows["reference model"] = 0.0
    tokens = micro_batch_tokens(c)
    per_layer = shape.num_layers + ACTIVATION_VALUES if c.gradient_checkpointing \
        else shape.num_layers * ACTIVATION_VALUES
    rows["activations"] = float(tokens * shape.hidden_size * per_layer * dtype_bytes)
    rows["logits (fp32)"] = float(tokens * shape.vocab_size * 4)
    rows.update(vision_memory_rows(  # image prompts: the vision tower's activations
        c, max(1, tokens // (c.max_prompt_length + c.max_response_length)), dtype_bytes))
    notes.append(f"micro-batch: {tokens} tokens; activations {ACTIVATION_VALUES} values per "
                 "token x hidden x layer" + (" (gradient checkpointing: 1 per layer + one "
                                             "layer's)" if c.gradient_checkpointing else ""))
    return rows, notes


def sequences_at_once(c: GRPOSettings) -> int:
    """The most sequences one env runner's sampler holds at once: its share of a step's
    trajectories, ``max_staleness`` steps' worth in continuous rollouts (the groups the
    driver keeps in flight)."""
    steps = max(1, c.max_staleness) if c.resolved_rollout_mode() == "continuous" else 1
    runners = max(1, c.num_env_runners)
    return -(-c.batch_plan().trajectories_per_step * steps // runners)


def sampler_memory(c: GRPOSettings, shape: ModelShape) -> tuple[dict[str, float], list[str]]:
    """Device bytes of one sampler (vLLM or transformers), by row, and notes."""
    options = dict(c.sampler_config)
    dtype_bytes = DTYPE_BYTES.get(c.sampler_dtype, 4)
    seqs = sequences_at_once(c)
    if c.sampler != "hf":
        seqs = min(seqs, int(options.get("max_num_seqs", VLLM_MAX_NUM_SEQS)))
    elif options.get("max_batch_size"):
        seqs = min(seqs, int(options["max_batch_size"]))
    length = c.max_prompt_length + c.max_response_length
    kv = seqs * length * shape.num_layers * 2 * shape.num_kv_heads * shape.head_dim * dtype_bytes
    notes = [f"KV cache: {seqs} sequences x {length} tokens at once"]
    fraction = c.sampler_memory_fraction or options.get("gpu_memory_utilization")
    if fraction and c.sampler != "hf":
        notes.append(f"on a GPU vLLM reserves {fraction:.0%} of the GPU (weights + KV cache "
                     "+ its activations) whatever this estimate says")
    return {"weights": float(shape.num_params * dtype_bytes), "KV cache": float(kv)}, notes


def estimate_memory(c: GRPOSettings, shape: ModelShape | None = None) -> MemoryEstimate:
    """The memory estimate of a GRPO config (its model's shape is read unless given)."""
    if shape is None:
        from rllib_grpo.models.registry import resolve_model

        shape = model_shape(resolve_model(c.model_path), c.lora_rank, c.lora_target_modules)
    learner, learner_notes = learner_memory(c, shape)
    sampler, sampler_notes = sampler_memory(c, shape)
    return MemoryEstimate(shape, learner, sampler, learner_notes + sampler_notes)


# --------------------------------------------------------------------------- text
def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def format_estimate(est: MemoryEstimate, c: GRPOSettings) -> list[str]:
    """The estimate as a small table (lines)."""
    s = est.shape
    lora = f", LoRA r={c.lora_rank}: {s.lora_params / 1e6:.3g}M trainable" if c.lora_rank else ""
    dtypes = c.compute_dtype if c.master_weights_dtype == c.compute_dtype or c.lora_rank else \
        f"{c.master_weights_dtype} master / {c.compute_dtype} compute"
    lines = [f"memory estimate: {s.num_params / 1e6:.3g}M params ({s.num_layers} layers x "
             f"{s.hidden_size} hidden, vocab {s.vocab_size}), {dtypes}{lora}",
             f"  per learner ({c.batch_plan().num_learners} learner(s))"]
    lines += [f"    {name:<22}{format_bytes(value):>12}" for name, value in est.learner.items()]
    lines.append(f"    {'total':<22}{format_bytes(est.learner_total):>12}")
    lines.append(f"  per sampler ({c.sampler})")
    lines += [f"    {name:<22}{format_bytes(value):>12}" for name, value in est.sampler.items()]
    lines.append(f"    {'total':<22}{format_bytes(est.sampler_total):>12}")
    lines += [f"  ({note})" for note in est.notes]
    return lines


def memory_lines(c: GRPOSettings) -> list[str]:
    """`format_estimate` for `explain`, or one line saying why there is none."""
    try:
        return format_estimate(estimate_memory(c), c)
    except Exception as error:  # noqa: BLE001  (explain must not fail on a missing model)
        reason = str(error).strip().splitlines()[0][:160] if str(error).strip() else ""
        return [f"memory estimate: unavailable ({type(error).__name__}: {reason})"]
