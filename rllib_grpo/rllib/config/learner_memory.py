"""The learner's side of the memory plan (`rllib_grpo.rllib.config.memory`): the bytes a
learner's tensors take, from the model's shape and the settings alone.

What the code allocates, tensor by tensor: the micro-batch the learner packs
(`micro_batch`), the activations transformers' decoder layers save for backward
(`layer_activation_bytes`), the logits as ``token_stats`` holds them (`logits_bytes`), the
weights, gradients, AdamW states and reference on the device (`learner_states`) and the
compute copy of the weights (`gathered_bytes`).  The settings' own resolution of
``gradient_checkpointing`` reads `activations_dominate`, so this module reads the settings
through the `MemorySettings` protocol and imports no settings module.  No Ray here.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Protocol

from rllib_grpo.algos import logprobs_from_logits
from rllib_grpo.algos.token_stats import DEFAULT_CHUNK_TOKENS
from rllib_grpo.models.lm_head import FUSED_HEAD_MODEL_TYPES
from rllib_grpo.models.shapes import ModelShape, model_shape

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
ADAPTER_BYTES = 4  # peft keeps adapters in fp32 (autocast_adapter_dtype)
FP32 = 4  # softmax statistics and norms run in float32 whatever the compute dtype
# Rows of `logprobs_from_logits`'s log-sum-exp temporaries (its default chunk).
LOGPROB_CHUNK_ROWS: int = inspect.signature(logprobs_from_logits).parameters["chunk_size"].default


class MemorySettings(Protocol):
    """The fields of a GRPO config (`GRPOSettings` with RLlib's own) that size a learner's
    memory; a protocol, so that settings.py can use this module without a cycle."""

    model_path: str
    max_prompt_length: int
    max_response_length: int
    max_tokens_per_micro_batch: int
    use_remove_padding: bool
    share_prompt_prefix: bool
    group_size: int
    lora_rank: int
    lora_target_modules: Any
    fsdp: bool
    fsdp_cpu_offload: bool
    optimizer_offload: bool
    ref_param_offload: bool
    master_weights_dtype: str

    @property
    def learners_on_gpus(self) -> bool: ...

    @property
    def compute_dtype(self) -> str: ...

    @property
    def micro_batches_by_tokens(self) -> bool: ...

    @property
    def learner_token_stats(self) -> str: ...

    @property
    def needs_reference(self) -> bool: ...

    def batch_plan(self) -> Any: ...


# --------------------------------------------------------------------------- the micro-batch
@dataclasses.dataclass(frozen=True)
class MicroBatch:
    """One learner micro-batch at full length: its trajectories, the token slots its
    forward computes (packed rows: a shared prompt once, rows' unused tails included), the
    response tokens whose logits it keeps, how many micro-batches make a mini-batch, and
    the dense attention mask's bytes where the rows carry one (None: no mask)."""

    trajectories: int
    slots: int
    logit_rows: int
    per_minibatch: int
    mask_bytes: int | None = None

    @property
    def masked_attention(self) -> bool:
        """A dense mask keeps sdpa off its grouped-query path: keys and values repeated."""
        return self.mask_bytes is not None


def dense_mask_attention(c: MemorySettings) -> bool:
    """The learner attends through a dense mask (sdpa: CPU learners, 32-bit compute) rather
    than a varlen flash kernel (16-bit compute on GPU learners, where flash-attention runs)."""
    return not (c.learners_on_gpus and c.compute_dtype in ("bfloat16", "float16"))


def micro_batch(c: MemorySettings, shape: ModelShape) -> MicroBatch:
    """The learner's micro-batch when every sequence runs to its length limits, laid out by
    the package's own packing (`rllib_grpo.models.packing.pack_rows`, and
    `rllib_grpo.models.shared_prefix.build_units` where a group's responses share one copy
    of their prompt)."""
    from rllib_grpo.models.packing import pack_rows
    from rllib_grpo.models.shared_prefix import build_units

    prompt, response = c.max_prompt_length, c.max_response_length
    length = prompt + response
    per_learner = max(1, c.batch_plan().trajectories_per_minibatch_per_learner)
    if c.micro_batches_by_tokens:
        size = min(per_learner, max(1, c.max_tokens_per_micro_batch // length))
    else:
        size = min(per_learner, c.batch_plan().micro_batch_size_per_learner or per_learner)
    per_minibatch = -(-per_learner // size)
    if not c.use_remove_padding:  # padded rows: every row computes the prompt and response
        return MicroBatch(size, size * length, size * length, per_minibatch)
    dense = dense_mask_attention(c)
    if not (dense and c.share_prompt_prefix and c.group_size > 1):
        # Varlen kernels take one row of all tokens; a dense mask rows of the longest.
        return MicroBatch(size, size * length, size * response, per_minibatch)
    groups = [list(range(start, min(start + c.group_size, size)))
              for start in range(0, size, c.group_size)]
    units = build_units([prompt] * size, [response] * size, groups,
                        max(length, shape.hidden_size))
    unit_lengths = [prompt + response * len(unit) for unit in units]
    rows = pack_rows(unit_lengths, max(unit_lengths))
    row_len = max(sum(unit_lengths[u] for u in row) for row in rows)
    return MicroBatch(size, len(rows) * row_len, size * response, per_minibatch,
                      mask_bytes=len(rows) * row_len * row_len)


# --------------------------------------------------------------------------- activations
@dataclasses.dataclass(frozen=True)
class Precision:
    """Bytes per value of the learner's tensors: ``stream`` the residual stream (the
    embedding's output dtype), ``compute`` matmul inputs and outputs, ``norm_out`` a
    norm's output (its weight times the normalised stream), ``master`` trained weights."""

    stream: int
    compute: int
    norm_out: int
    master: int


def learner_precision(c: MemorySettings) -> Precision:
    """How the learner's forward holds its tensors: FSDP2 computes with its parameters cast
    to the compute dtype (the stream too); one learner runs bf16 compute as autocast over
    fp32 master weights (embedding, norms and residual stream stay fp32)."""
    compute = DTYPE_BYTES[c.compute_dtype]
    master = DTYPE_BYTES[c.master_weights_dtype]
    if c.lora_rank > 0 or fsdp_shards(c) > 1 or master == compute:
        return Precision(stream=compute, compute=compute, norm_out=compute, master=master)
    return Precision(stream=master, compute=compute, norm_out=master, master=master)


def layer_activation_bytes(shape: ModelShape, p: Precision, masked: bool) -> float:
    """Bytes one token saves for backward in one decoder layer of transformers' Llama /
    Qwen2 / Qwen3 / Mistral blocks (what autograd keeps, per tensor):

    * each of the two RMSNorms: its float32 input (4 h), the normalised input in the stream
      dtype, and its output as the next matmuls' input (each matmul its own cast copy
      under autocast: q/k/v three, gate/up two);
    * attention: the queries and keys after RoPE, the values and the output (the keys and
      values repeated to the query heads where a dense mask keeps sdpa off its GQA path),
      the log-sum-exp; Qwen3's q/k norms their float32 inputs and outputs;
    * the MLP: gate and up projections, SiLU's output and the product (4 x intermediate).
    """
    h, q, kv, i = shape.hidden_size, shape.q_width, shape.kv_width, shape.intermediate_size
    c = p.compute

    def norm(consumers: int) -> float:
        matmul_inputs = h * p.norm_out if p.norm_out == c else consumers * h * c
        return FP32 * h + p.stream * h + matmul_inputs

    keys_values = 2 * q if masked else 2 * kv
    attention = c * (2 * q + keys_values) + FP32 * shape.num_heads
    if shape.qk_norm:
        attention += (FP32 + c) * (q + kv)
    return norm(3) + attention + norm(2) + 4 * c * i


def activation_bytes(c: MemorySettings, shape: ModelShape, mb: MicroBatch,
                     checkpointing: bool) -> float:
    """What one micro-batch's training forward saves for backward: every layer's
    activations, or with gradient checkpointing each layer's input plus one layer's
    activations (its recompute); and the final norm's."""
    p = learner_precision(c)
    layer = layer_activation_bytes(shape, p, mb.masked_attention)
    per_token = (shape.num_layers * p.stream * shape.hidden_size + layer if checkpointing
                 else shape.num_layers * layer)
    final_norm = (FP32 + p.stream + p.norm_out) * shape.hidden_size
    return float(mb.slots * (per_token + final_norm) + (mb.mask_bytes or 0))


def backward_temporaries(shape: ModelShape, p: Precision, slots: int) -> float:
    """The gradients a decoder layer's backward holds at once beside the saved activations:
    three of the MLP's intermediates' (down's input, SiLU's output, up's output) and two of
    the residual stream's."""
    return float(slots * (3 * p.compute * shape.intermediate_size
                          + 2 * p.stream * shape.hidden_size))


def no_grad_forward_bytes(shape: ModelShape, p: Precision, slots: int) -> float:
    """The transient of a no-grad forward: one layer's MLP intermediates and a few hidden
    states, freed layer by layer."""
    return float(slots * (4 * p.compute * shape.intermediate_size
                          + (FP32 + 2 * p.stream) * shape.hidden_size))


def resolved_token_stats(c: MemorySettings, model_type: str) -> str:
    """``token_stats`` as the learner's model resolves it (`rllib_grpo.models.lm_head.
    token_stats_mode`): 'auto' is 'fused' for an unwrapped (no FSDP2, no LoRA) model whose
    head `fused_head` takes, else 'chunked'."""
    mode = c.learner_token_stats
    if mode != "auto":
        return mode
    fusable = (fsdp_shards(c) == 1 and c.lora_rank <= 0
               and model_type in FUSED_HEAD_MODEL_TYPES)
    return "fused" if fusable else "chunked"


def logits_bytes(c: MemorySettings, shape: ModelShape, rows: int, *, training: bool,
                 with_entropy: bool) -> float:
    """Bytes the response logits take at their peak in one forward (and its backward when
    ``training``), by ``token_stats``:

    * 'full': the model's logits (compute dtype), their float32 copy divided by the
      temperature, and the entropy's softmax and product (each float32); in backward the
      saved copy and the log-sum-exp's and gather's gradients (four float32 copies);
    * 'chunked': the model's logits and the copy the chunked function saves (compute
      dtype), its input gradient in backward, and a few float32 (chunk, V) blocks;
    * 'fused': no logits: the head's weight cast to the compute dtype, its float32
      gradient, and the (chunk, V) blocks.
    """
    mode = resolved_token_stats(c, shape.model_type)
    compute = DTYPE_BYTES[c.compute_dtype]
    vocab = shape.vocab_size
    blocks = 3 * min(rows, DEFAULT_CHUNK_TOKENS) * vocab * FP32
    if mode == "full":
        forward = compute + FP32 + (2 * FP32 if with_entropy else FP32)
        backward = 4 * FP32 if training else 0
        lse = min(rows, LOGPROB_CHUNK_ROWS) * vocab * FP32
        return float(rows * vocab * max(forward, backward) + (0 if with_entropy else lse))
    if mode == "chunked":
        return float(rows * vocab * compute * (3 if training else 2) + blocks)
    head = vocab * shape.hidden_size
    cast = head * compute if compute != DTYPE_BYTES[c.master_weights_dtype] else 0
    return float(cast + (head * FP32 if training else 0) + blocks)


# --------------------------------------------------------------------------- the learner
def fsdp_shards(c: MemorySettings) -> int:
    """How many ways FSDP2 shards the learner's model (1: a whole model per learner)."""
    learners = c.batch_plan().num_learners
    return learners if (c.fsdp and learners >= 2 and c.lora_rank <= 0) else 1


def activations_dominate(c: MemorySettings, shape: ModelShape) -> bool:
    """Whether one micro-batch's activations without checkpointing are the largest item of
    the learner's update (larger than its weights, gradients, AdamW states, reference,
    compute copy and logits, each): where gradient checkpointing pays for its recompute."""
    mb = micro_batch(c, shape)
    states = learner_states(c, shape)
    others = [states["weights"], states["gradients"], states["AdamW on step"],
              states["reference"], gathered_bytes(c, shape, with_grads=True),
              logits_bytes(c, shape, mb.logit_rows, training=True, with_entropy=True)]
    return activation_bytes(c, shape, mb, checkpointing=False) > max(others)


def learner_states(c: MemorySettings, shape: ModelShape) -> dict[str, float]:
    """Bytes of the learner's persistent tensors on its device: ``weights``, ``gradients``,
    ``AdamW`` (zero where offloaded), ``AdamW on step`` (what the step brings to the
    device), ``reference`` (where it lives on the device) and ``reference visiting`` (what a
    host-offloaded reference brings for its pass: all of it on one learner; under FSDP2 its
    shards stay in host memory and each unit visits as the gathered units do)."""
    shards = fsdp_shards(c)
    host = shards > 1 and c.fsdp_cpu_offload
    compute, master = DTYPE_BYTES[c.compute_dtype], DTYPE_BYTES[c.master_weights_dtype]
    if c.lora_rank > 0:
        trainable, train_bytes = shape.lora_params, ADAPTER_BYTES
        weights = float(shape.num_params * compute + trainable * train_bytes)
    else:
        trainable, train_bytes = shape.num_params, master
        weights = shape.num_params * master / shards
    grads = trainable * train_bytes / shards
    adam = 2 * trainable * train_bytes / shards
    reference = (shape.num_params * compute / shards
                 if c.needs_reference and c.lora_rank <= 0 else 0.0)
    on_device = not (c.ref_param_offload and c.learners_on_gpus)
    return {
        "weights": 0.0 if host else weights, "gradients": 0.0 if host else grads,
        "AdamW": 0.0 if host or c.optimizer_offload else adam,
        "AdamW on step": 0.0 if host else adam,
        "reference": reference if on_device else 0.0,
        "reference visiting": 0.0 if on_device or shards > 1 else reference,
    }


def gathered_bytes(c: MemorySettings, shape: ModelShape, *, with_grads: bool) -> float:
    """The compute copy of the weights during a forward (and backward): with bf16 compute
    over fp32 master weights on one learner autocast's cache of every cast weight; under
    FSDP2 the all-gathered root (embeddings, final norm, head: gathered for the whole pass)
    and ~2 decoder layers in the compute dtype, and in backward the unsharded gradients of
    the root and one layer."""
    compute, master = DTYPE_BYTES[c.compute_dtype], DTYPE_BYTES[c.master_weights_dtype]
    shards = fsdp_shards(c)
    root = shape.num_params - shape.num_layers * shape.layer_params
    if shards > 1:
        grads = (root + shape.layer_params) * compute if with_grads else 0.0
        return float((root + 2 * shape.layer_params) * compute + grads)
    if c.lora_rank > 0 or compute >= master:
        return 0.0
    return float(shape.num_params * compute)


def config_shape(c: MemorySettings) -> ModelShape:
    """The shape of the config's model (`rllib_grpo.models.shapes.model_shape`)."""
    return model_shape(c.model_path, c.lora_rank, c.lora_target_modules)
