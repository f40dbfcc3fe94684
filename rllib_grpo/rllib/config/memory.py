"""The pre-flight memory plan: the bytes of every process on every GPU in each phase of a
training step, against the GPU's memory, before anything starts.

Levers (settings block "LoRA and memory", and the batch plan):

* ``use_dynamic_bsz`` + ``max_tokens_per_micro_batch``: micro-batches to a token budget,
  which bounds activations and logits (on GPU learners by default);
* ``token_stats``: the response log-probs and entropies a chunk of tokens at a time, with
  no full float32 copy of the logits ('auto', the GPU default);
* ``gradient_checkpointing``: keep one hidden state per layer and recompute the rest in
  the backward pass (on GPU learners where the activations are the update's largest item);
* ``lora_rank``: only the adapter has gradients and AdamW states, and the reference is
  the policy with the adapter disabled (no copy);
* ``ref_param_offload``: the reference lives in host memory and visits the learner's
  device for the reference pass (a no-op on CPU); under FSDP each learner keeps its shard
  in host memory and each layer visits for its forward;
* ``optimizer_offload``: AdamW states in host memory except during the optimizer step;
* ``fsdp`` with >= 2 learners shards weights, gradients, AdamW states and the reference
  1/N (``fsdp_cpu_offload`` moves the shards to host memory);
* ``sampler_memory_fraction``: vLLM's ``gpu_memory_utilization``; ``tensor_parallel_size``
  splits an engine's weights over GPUs.

The plan (`memory_plan`) takes the model's shape without its weights
(`rllib_grpo.models.shapes.model_shape`: a config.json or the built-in table) and the
placement plan (`GRPOConfig.placement_plan`: which learner rank and which engine shard sit
on each GPU), and models what the code allocates (the learner's tensors:
`rllib_grpo.rllib.config.learner_memory`):

* a learner: its master weights, gradients (from the update's backward until the learner
  drops them before sleeping engines wake, `rllib_grpo.rllib.choreography`, else until the
  next step's ``zero_grad``) and two AdamW states in ``master_weights_dtype``, 1/N under
  FSDP2; the reference in the compute dtype, 1/N (offloaded: in host memory, visiting the
  device whole on one learner, unit by unit under FSDP2); at build, under FSDP2, rank 0's
  rows of one tensor on their way to a rank; with bf16 compute over fp32 master weights the
  compute copy (autocast caches every cast weight on one learner; FSDP2 holds the
  all-gathered root and ~2 decoder layers, and the root's and one layer's unsharded
  gradients); the activations one micro-batch saves for backward (per token and layer,
  the tensors transformers' decoder layers save) and a layer's backward temporaries; the
  logits of its response tokens as ``token_stats`` holds them; one CUDA context;
* a vLLM engine (shard): ``gpu_memory_utilization`` of the GPU awake (its weights 1/TP, the
  rest KV cache, CUDA graphs and activations), its CUDA context alone asleep (level 2),
  its weights alone between the weights-first wake and the KV cache's;
* a transformers sampler: its weights in the sampler's dtype and the KV cache of every
  sequence of a generation call.

The step's phases (`PHASES`) follow verl's choreography: the engines sample beside the
learner's resident state; the learner is built beside awake engines (each rank
materialises only its shard); the no-grad reference (and old-log-prob) pass and the update
run while the engines sleep; the learner returns its cached memory, the engines wake their
weights, take the weight sync, then their KV cache.  A GPU whose processes exceed its
memory (``gpu_memory_gib``) in any phase is an error before Ray starts (`memory_errors`),
naming the settings that fix it.
"""

from __future__ import annotations

import dataclasses

from rllib_grpo.models.shapes import ModelShape
from rllib_grpo.rllib.config import learner_memory
from rllib_grpo.rllib.config.gpu_layout import (
    COLOCATED_MEMORY_FRACTION,
    ENGINE_SHARD,
    ENV_RUNNER,
    FRACTIONAL_GPU_SAFETY,
    LEARNER,
    MAIN,
    gpu_of,
    tensor_parallel_size,
)
from rllib_grpo.rllib.config.learner_memory import (
    DTYPE_BYTES,
    MicroBatch,
    activation_bytes,
    backward_temporaries,
    fsdp_shards,
    gathered_bytes,
    learner_precision,
    learner_states,
    logits_bytes,
    micro_batch,
    no_grad_forward_bytes,
    resolved_token_stats,
)
from rllib_grpo.rllib.config.settings import GRPOSettings
from rllib_grpo.rllib.config.vision_plan import vision_memory_rows
from rllib_grpo.weights.plan import WEIGHT_SYNC_BUCKET_BYTES

GIB = 2**30
CUDA_CONTEXT_BYTES = GIB // 2  # a process's CUDA context and kernels (~0.5 GiB)
SYNC_BUCKETS = 2  # a weight sync holds at most two buckets on each side
# What vLLM defaults to when nothing sets gpu_memory_utilization (a GPU of its own).
VLLM_DEFAULT_MEMORY_FRACTION = 0.9

# The phases of a step, in order (`PHASE_DOCS` says what each is).
SAMPLING, BUILD, NO_GRAD_PASS, UPDATE, ASLEEP, WAKE, SYNC = (
    "sample", "build", "ref pass", "update", "asleep", "wake", "sync")
PHASES = (SAMPLING, BUILD, NO_GRAD_PASS, UPDATE, ASLEEP, WAKE, SYNC)
PHASE_DOCS = {
    SAMPLING: "engines awake and sampling; the learner holds its resident state",
    BUILD: "the learner built beside awake engines (each rank materialises its shard)",
    NO_GRAD_PASS: "the reference (and old-log-prob) pass, engines asleep",
    UPDATE: "the update's peak (forward + backward of one micro-batch, or AdamW's step)",
    ASLEEP: "after the update: the learner returned its cached memory, engines asleep",
    WAKE: "engines wake their weights (the KV cache stays released)",
    SYNC: "the weight sync: the learner's buckets into the engines' weights",
}


def learner_phases(c: GRPOSettings, shape: ModelShape, *, on_gpu: bool
                   ) -> dict[str, dict[str, float]]:
    """The learner process's bytes, by phase and row (`PHASES`; a learner on CPU has no
    CUDA context and its phases are the same)."""
    states = learner_states(c, shape)
    mb = micro_batch(c, shape)
    p = learner_precision(c)
    shards = fsdp_shards(c)
    checkpointing = c.checkpoints_activations
    # Between steps: the gradients stay until the next zero_grad, unless the engines sleep
    # beside the learner (`rllib_grpo.rllib.choreography`: the learner drops them and
    # returns its cache before they wake).
    resident = {"weights": states["weights"],
                "gradients": 0.0 if c.sampler_sleeps else states["gradients"],
                "AdamW": states["AdamW"], "reference": states["reference"]}
    context = {"CUDA context": float(CUDA_CONTEXT_BYTES)} if on_gpu else {}
    # Build: each rank materialises its shard; under FSDP2 rank 0 sends every other rank
    # its rows of each tensor through its device, one rank's rows at a time.
    rows_in_flight = shape.largest_tensor * p.master / shards if shards > 1 else 0.0
    build = {**context, "weights": states["weights"], "reference": states["reference"],
             "loading (one rank's rows)": rows_in_flight}
    # The no-grad passes: the reference's (visiting from the host where offloaded) and,
    # unless the update's forward gives them, the old log-probs'.
    from rllib_grpo.rllib.config.staleness import old_log_probs_from_update

    old_pass = not old_log_probs_from_update(c)
    reference_gathered = gathered_bytes(c, shape, with_grads=False) if shards > 1 else 0.0
    passes = []
    if c.needs_reference and c.lora_rank <= 0:
        passes.append({"reference visiting": states["reference visiting"],
                       "gathered (compute dtype)": reference_gathered,
                       "logits": logits_bytes(c, shape, mb.logit_rows, training=False,
                                              with_entropy=False)})
    if old_pass or c.lora_rank > 0:
        passes.append({"gathered (compute dtype)": gathered_bytes(c, shape, with_grads=False),
                       "logits": logits_bytes(c, shape, mb.logit_rows, training=False,
                                              with_entropy=old_pass)})
    no_grad = max(passes, key=lambda rows: sum(rows.values()), default={})
    no_grad_pass = {**context, **resident, **no_grad, "forward temporaries":
                    no_grad_forward_bytes(shape, p, mb.slots) if no_grad else 0.0}
    # The update, at the larger of three moments: the logits' peak (the forward's end or
    # the head's backward), a decoder layer's backward, and AdamW's step.  Gradients exist
    # from the first micro-batch's backward on (several micro-batches), else only the LM
    # head's while the activations are alive.
    head_grads = shape.largest_tensor * p.master / shards
    with_entropy = c.entropy_coeff != 0 or not old_pass
    training = {**context, **resident,
                "gradients": states["gradients"] if mb.per_minibatch > 1
                else min(head_grads, states["gradients"]),
                "gathered (compute dtype)": gathered_bytes(c, shape, with_grads=True),
                "activations": activation_bytes(c, shape, mb, checkpointing),
                # Image prompts: the vision tower's activations too.
                **vision_memory_rows(c, mb.trajectories, p.compute)}
    logits_peak = {**training, "logits": logits_bytes(c, shape, mb.logit_rows, training=True,
                                                       with_entropy=with_entropy)}
    layer_backward = {**training,
                      "backward temporaries": backward_temporaries(shape, p, mb.slots)}
    step = {**context, **resident, "gradients": states["gradients"],
            "AdamW": states["AdamW on step"]}
    update = max((logits_peak, layer_backward, step), key=lambda rows: sum(rows.values()))
    sync = {**context, **resident, "sync buckets": sync_bucket_bytes(c, shape)}
    return {SAMPLING: {**context, **resident}, BUILD: build, NO_GRAD_PASS: no_grad_pass,
            UPDATE: update, ASLEEP: {**context, **resident}, WAKE: {**context, **resident},
            SYNC: sync}


def sync_bucket_bytes(c: GRPOSettings, shape: ModelShape) -> float:
    """What a weight sync holds on the learner: two buckets in the sampler's dtype (at most
    the whole model), and under FSDP2 one all-gathered full tensor in the master dtype."""
    sampler = DTYPE_BYTES.get(c.sampler_dtype, 4)
    bucket = min(WEIGHT_SYNC_BUCKET_BYTES, shape.num_params * sampler)
    gathered = shape.largest_tensor * DTYPE_BYTES[c.master_weights_dtype] \
        if fsdp_shards(c) > 1 else 0.0
    return float(SYNC_BUCKETS * bucket + gathered)


def learner_peak(c: GRPOSettings, shape: ModelShape | None = None) -> tuple[str, float]:
    """The learner process's largest phase and its bytes, without a CUDA context (the
    prediction `benchmarks/memory_plan.py` checks against a CPU learner's measured peak)."""
    shape = shape or learner_memory.config_shape(c)
    phases = learner_phases(c, shape, on_gpu=False)
    name = max(phases, key=lambda phase: sum(phases[phase].values()))
    return name, sum(phases[name].values())


# --------------------------------------------------------------------------- samplers
def sequences_at_once(c: GRPOSettings) -> int:
    """The most sequences one env runner's sampler holds at once: its share of a step's
    trajectories, ``max_staleness`` steps' worth in continuous rollouts (the groups the
    driver keeps in flight)."""
    steps = max(1, c.max_staleness) if c.resolved_rollout_mode() == "continuous" else 1
    runners = max(1, c.num_env_runners)
    return -(-c.batch_plan().trajectories_per_step * steps // runners)


def engine_memory_fraction(c: GRPOSettings) -> float:
    """The share of a GPU a vLLM engine takes awake: the ``gpu_memory_utilization``
    `rllib_grpo.rllib.env_runner.engine.engine_options` gives it, else vLLM's default."""
    fraction = c.sampler_memory_fraction or dict(c.sampler_config).get("gpu_memory_utilization")
    if fraction:
        return float(fraction)
    if c.sampler_sleeps:
        return COLOCATED_MEMORY_FRACTION
    gpus = c.num_gpus_per_env_runner or 0
    return round(FRACTIONAL_GPU_SAFETY * gpus, 3) if 0 < gpus < 1 \
        else VLLM_DEFAULT_MEMORY_FRACTION


def sampler_rows(c: GRPOSettings, shape: ModelShape, device_bytes: float, tp: int
                 ) -> dict[str, dict[str, float]]:
    """One sampler process (a vLLM engine shard, or a transformers sampler) on a GPU, by
    phase: awake the whole time unless it sleeps during the update (level 2: its context
    alone), then its weights alone until the sync is in."""
    context = {"CUDA context": float(CUDA_CONTEXT_BYTES)}
    dtype = DTYPE_BYTES.get(c.sampler_dtype, 4)
    weights = shape.num_params * dtype / tp
    if c.sampler == "hf":
        seqs = sequences_at_once(c)
        if dict(c.sampler_config).get("max_batch_size"):
            seqs = min(seqs, int(c.sampler_config["max_batch_size"]))
        length = c.max_prompt_length + c.max_response_length
        kv = seqs * length * shape.num_layers * 2 * shape.kv_width * dtype
        awake = {**context, "sampler weights": weights, "KV cache": float(kv)}
        return {phase: dict(awake) for phase in PHASES}
    share = engine_memory_fraction(c) * device_bytes
    awake = {**context, "vLLM weights": weights,
             "KV cache, CUDA graphs, activations": max(share - weights, 0.0)}
    if not c.sampler_sleeps:
        return {phase: dict(awake) for phase in PHASES}
    weights_only = {**context, "vLLM weights": weights}
    return {SAMPLING: awake, BUILD: dict(awake), NO_GRAD_PASS: dict(context),
            UPDATE: dict(context), ASLEEP: dict(context), WAKE: weights_only,
            SYNC: dict(weights_only)}


# --------------------------------------------------------------------------- the plan
@dataclasses.dataclass
class ProcessMemory:
    """One process on a GPU (or a CPU learner): its name, its role (the name where GPUs
    alike share a table) and its bytes by phase and row."""

    name: str
    role: str
    phases: dict[str, dict[str, float]]

    def total(self, phase: str) -> float:
        return sum(self.phases[phase].values())


@dataclasses.dataclass
class DeviceMemory:
    """The processes on one GPU (``gpus``: the GPUs that hold the same processes' memory,
    as `layout.gpu_rows` names them) and their totals by phase."""

    gpus: list[str]
    processes: list[ProcessMemory]

    def total(self, phase: str) -> float:
        return sum(p.total(phase) for p in self.processes)

    def signature(self) -> tuple:
        return tuple((p.role, tuple(tuple(sorted(p.phases[ph].items())) for ph in PHASES))
                     for p in self.processes)


@dataclasses.dataclass
class MemoryPlan:
    """Every GPU's processes and phases (``devices``), or the CPU learner's, against
    ``device_bytes`` (None on CPU: host memory is not planned against a limit)."""

    shape: ModelShape
    devices: list[DeviceMemory]
    device_bytes: float | None
    notes: list[str]


def memory_plan(c: GRPOSettings, shape: ModelShape | None = None) -> MemoryPlan:
    """The plan of a GRPO config (a `GRPOConfig`: its placement plan places the processes;
    its model's shape is read unless given)."""
    shape = shape or learner_memory.config_shape(c)
    device = c.gpu_memory_gib * GIB
    plan = c.placement_plan()
    learner = learner_phases(c, shape, on_gpu=True)
    mb = micro_batch(c, shape)
    notes = _notes(c, shape, mb)
    if not plan.uses_gpus:
        name = "learner" if c.num_learners else "main process (learner)"
        cpu = ProcessMemory(name, name, learner_phases(c, shape, on_gpu=False))
        return MemoryPlan(shape, [DeviceMemory(["CPU (host memory)"], [cpu])], None, notes)
    sampler = "vLLM engine" if c.sampler != "hf" else "transformers sampler"
    devices: list[DeviceMemory] = []
    for index, bundle in enumerate(plan.bundles):
        if not bundle.gpus:
            continue
        where = gpu_of(plan, index)
        label = f"node {where[0]} GPU {where[1]}" if where else "the main process's GPU"
        processes = []
        for seat in (s for s in plan.seats if s.bundle == index and s.gpus):
            if seat.role == LEARNER:
                processes.append(ProcessMemory(f"learner rank {seat.index}", "learner (a rank)",
                                               learner))
            elif seat.role == MAIN and c.num_learners == 0:
                if c.num_env_runners == 0:  # local mode: the learner and sampler, one process
                    name = f"main process: learner + {sampler}"
                    phases = _one_process(learner, sampler_rows(c, shape, device, 1))
                else:
                    name, phases = "main process: learner", learner
                processes.append(ProcessMemory(name, name, phases))
            elif seat.role in (ENV_RUNNER, ENGINE_SHARD):
                tp = plan.engine_tp if seat.role == ENGINE_SHARD else 1
                name, role = ((f"engine {seat.engine} shard {seat.index}",
                               f"{sampler} shard (TP {tp})") if seat.role == ENGINE_SHARD
                              else (f"env runner {seat.index}: {sampler}", sampler))
                processes.append(ProcessMemory(name, role, sampler_rows(c, shape, device, tp)))
            else:
                notes.append(f"{seat.name} on {label}: not planned (its own model)")
        devices.append(DeviceMemory([label], processes))
    return MemoryPlan(shape, _merge_alike(devices), device, notes)


def _one_process(learner: dict[str, dict[str, float]], sampler: dict[str, dict[str, float]]
                 ) -> dict[str, dict[str, float]]:
    """The learner and the sampler in one process (local mode): one CUDA context."""
    merged = {}
    for phase in PHASES:
        rows = dict(learner[phase])
        for name, value in sampler[phase].items():
            if name != "CUDA context":
                rows[name] = rows.get(name, 0.0) + value
        merged[phase] = rows
    return merged


def _merge_alike(devices: list[DeviceMemory]) -> list[DeviceMemory]:
    """GPUs whose processes hold the same bytes in every phase, as one entry."""
    merged: list[DeviceMemory] = []
    for device in devices:
        twin = next((m for m in merged if m.signature() == device.signature()), None)
        if twin is None:
            merged.append(DeviceMemory(list(device.gpus), device.processes))
        else:
            twin.gpus += device.gpus
    return merged


def _notes(c: GRPOSettings, shape: ModelShape, mb: MicroBatch) -> list[str]:
    how = (f"token budget {c.max_tokens_per_micro_batch}" if c.micro_batches_by_tokens
           else f"{mb.trajectories} trajectories per micro-batch")
    return [
        f"micro-batch at full length ({c.max_prompt_length} + {c.max_response_length} "
        f"tokens): {how}: {mb.trajectories} trajectories, {mb.slots} tokens computed, "
        f"{mb.logit_rows} response logits; {mb.per_minibatch} micro-batch(es) per mini-batch",
        f"token_stats={c.learner_token_stats!r} "
        f"({resolved_token_stats(c, shape.model_type)}), gradient "
        f"checkpointing {'on' if c.checkpoints_activations else 'off'}, compute "
        f"{c.compute_dtype} over {c.master_weights_dtype} master weights"
        + (f", FSDP2 over {fsdp_shards(c)} learners" if fsdp_shards(c) > 1 else ""),
    ]


# --------------------------------------------------------------------------- errors
def _budget_fix(c: GRPOSettings) -> str:
    return ("a smaller max_tokens_per_micro_batch" if c.micro_batches_by_tokens else
            "use_dynamic_bsz=True with max_tokens_per_micro_batch (a token budget per "
            "micro-batch)")


MORE_GPUS = "more GPUs (FSDP2 shards weights, gradients, AdamW and the reference 1/N: " \
            "num_learners, GRPOConfig.colocate)"
# The settings that shrink each row, largest effect first (`_fixes` adds the token budget's).
ROW_FIXES: dict[str, tuple[str, ...]] = {
    "activations": ("gradient_checkpointing=True",),
    "logits": ("token_stats='auto' (chunked log-softmax and entropy, no full float32 copy "
               "of the logits)",),
    "weights": (MORE_GPUS, "fsdp_cpu_offload=True"),
    "gradients": (MORE_GPUS, "fsdp_cpu_offload=True"),
    "AdamW": ("optimizer_offload=True", MORE_GPUS),
    "reference": ("ref_param_offload=True", MORE_GPUS),
    "reference visiting": (MORE_GPUS,),
    "gathered (compute dtype)": (MORE_GPUS,),
    "loading (one rank's rows)": (MORE_GPUS,),
    "vLLM weights": ("a larger tensor_parallel_size (sampler_config)",),
    "KV cache, CUDA graphs, activations": (
        "a lower gpu_memory_utilization (sampler_memory_fraction)",),
    "sampler weights": ("the vLLM sampler, which sleeps during the update",),
    "KV cache": ("fewer sequences per generation (sampler_config max_batch_size)",),
}
# Rows that scale with the micro-batch's tokens.
PER_TOKEN_ROWS = ("activations", "logits", "backward temporaries", "forward temporaries",
                  "vision activations")


def memory_errors(c: GRPOSettings) -> list[str]:
    """One error per GPU (GPUs alike: one) and phase whose processes exceed
    ``gpu_memory_gib``: the phase's largest rows and the settings that shrink them; and
    engines whose weights fill their share.  Nothing for CPU runs or a model whose shape is unknown (explain says
    why)."""
    if not _plans_gpus(c):
        return []
    try:
        plan = memory_plan(c)
    except Exception:  # noqa: BLE001  (an unknown shape: explain prints the reason)
        return []
    assert plan.device_bytes is not None
    errors = []
    for device in plan.devices:
        where = gpu_list(device.gpus)
        for process in device.processes:
            rows = process.phases[SAMPLING]
            share = rows.get("KV cache, CUDA graphs, activations")
            if share is not None and share <= 0:
                errors.append(
                    f"{where}: {process.name}'s weights ({_gib(rows['vLLM weights'])}) fill "
                    f"its share of the GPU (gpu_memory_utilization {engine_memory_fraction(c)}"
                    f" x {c.gpu_memory_gib:g} GiB), leaving no KV cache; raise "
                    "sampler_memory_fraction or tensor_parallel_size (sampler_config).")
        for phase in PHASES:
            total = device.total(phase)
            if total <= plan.device_bytes:
                continue
            rows = _rows_of(device, phase)
            largest = sorted(rows.items(), key=lambda item: -item[1])[:3]
            # The fixes of the rows that make a tenth of the phase or more (the largest always).
            weighty = [name for name, value in largest
                       if value >= 0.1 * total or name == largest[0][0]]
            fixes = list(dict.fromkeys(fix for name in weighty for fix in _fixes(c, name)))
            errors.append(
                f"{where} runs out of memory in phase {phase!r} ({PHASE_DOCS[phase]}): "
                f"{_gib(total)} of {c.gpu_memory_gib:g} GiB (gpu_memory_gib); largest: "
                + ", ".join(f"{row_label(c, plan.shape, name)} {_gib(value)}"
                            for name, value in largest)
                + ". Fix: " + "; or ".join(fixes) + " (rllib-grpo explain prints the plan).")
    return errors


def _plans_gpus(c: GRPOSettings) -> bool:
    return hasattr(c, "placement_plan") and (
        (c.num_gpus_per_learner or 0) > 0 or (c.num_gpus_per_env_runner or 0) > 0)


def _fixes(c: GRPOSettings, row: str) -> tuple[str, ...]:
    fixes = ROW_FIXES.get(row, ())
    if row == "activations" and c.checkpoints_activations:
        fixes = ()
    if row == "logits" and c.learner_token_stats != "full":
        fixes = ()
    if row == "AdamW" and c.optimizer_offload:
        fixes = fixes[1:]
    if row == "reference" and c.ref_param_offload:
        fixes = fixes[1:]
    if row in PER_TOKEN_ROWS:
        fixes += (_budget_fix(c),)
    return fixes


def _rows_of(device: DeviceMemory, phase: str) -> dict[str, float]:
    rows: dict[str, float] = {}
    for process in device.processes:
        for name, value in process.phases[phase].items():
            rows[name] = rows.get(name, 0.0) + value
    return rows


# --------------------------------------------------------------------------- text
def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def format_plan(plan: MemoryPlan, c: GRPOSettings) -> list[str]:
    """The plan as tables: per GPU (GPUs alike share one), a row per process and tensor, a
    column per phase, in GiB; the totals and what is left of the GPU."""
    s = plan.shape
    params = f"{s.num_params / 1e9:.3g}B" if s.num_params >= 1e9 else f"{s.num_params / 1e6:.3g}M"
    lines = [f"memory plan: {params} params ({s.num_layers} layers x "
             f"{s.hidden_size} hidden, vocab {s.vocab_size}; shape from {s.source})"
             + (f", GPUs of {c.gpu_memory_gib:g} GiB (gpu_memory_gib)" if plan.device_bytes
                else "")]
    lines += [f"  ({note})" for note in plan.notes]
    phases = PHASES if plan.device_bytes else (BUILD, NO_GRAD_PASS, UPDATE)
    largest = max(device.total(ph) for device in plan.devices for ph in phases)
    unit, scale = ("GiB", GIB) if plan.device_bytes or largest >= GIB else ("MiB", 2**20)
    width = 36
    for device in plan.devices:
        alike = len(device.gpus) > 1
        lines.append(f"  {gpu_list(device.gpus)}" + (" (alike)" if alike else "")
                     + f": {unit} by phase")
        lines.append("    " + " " * width + "".join(f"{ph:>9}" for ph in phases))
        for process in device.processes:
            lines.append(f"    {process.role if alike else process.name}")
            names = list(dict.fromkeys(n for ph in phases for n in process.phases[ph]))
            for name in names:
                values = [process.phases[ph].get(name, 0.0) for ph in phases]
                if not any(values):
                    continue
                label = row_label(c, plan.shape, name)
                lines.append(f"      {label:<{width - 2}}" + "".join(
                    f"{v / scale:>9.2f}" if v else f"{'-':>9}" for v in values))
        lines.append(f"    {'total':<{width}}" + "".join(
            f"{device.total(ph) / scale:>9.2f}" for ph in phases))
        if plan.device_bytes:
            lines.append(f"    {'free':<{width}}" + "".join(
                f"{(plan.device_bytes - device.total(ph)) / scale:>9.2f}" for ph in phases))
    return lines


def gpu_list(labels: list[str]) -> str:
    """``["node 0 GPU 0", ..., "node 0 GPU 7"]`` -> ``"node 0 GPUs 0-7"``."""
    by_node: dict[str, list[int]] = {}
    others = []
    for label in labels:
        node, _, gpu = label.rpartition(" GPU ")
        if node and gpu.isdigit():
            by_node.setdefault(node, []).append(int(gpu))
        else:
            others.append(label)
    parts = []
    for node, numbers in by_node.items():
        runs: list[list[int]] = []
        for number in sorted(numbers):
            if runs and number == runs[-1][-1] + 1:
                runs[-1].append(number)
            else:
                runs.append([number])
        text = ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)
        parts.append(f"{node} GPU{'s' if len(numbers) > 1 else ''} {text}")
    return "; ".join(parts + others)


def row_label(c: GRPOSettings, shape: ModelShape, row: str) -> str:
    """A row's name with the dtype and share it is counted in."""
    shards = fsdp_shards(c)
    share = f", 1/{shards}" if shards > 1 else ""
    master, compute = _short(c.master_weights_dtype), _short(c.compute_dtype)
    tp = tensor_parallel_size(c)
    tp_share = f", 1/{tp}" if tp > 1 else ""
    if c.lora_rank > 0 and row in ("weights", "gradients", "AdamW"):
        return {"weights": f"weights ({compute} base + fp32 adapter)",
                "gradients": "gradients (fp32 adapter)", "AdamW": "AdamW (fp32 adapter)"}[row]
    labels = {
        "weights": f"weights ({master}{share})", "gradients": f"gradients ({master}{share})",
        "AdamW": f"AdamW states ({master}{share})",
        "reference": f"reference ({compute}{share})",
        "reference visiting": f"reference from host ({compute})",
        "gathered (compute dtype)": (f"FSDP2 gathered ({compute})" if shards > 1
                                     else f"autocast weight copy ({compute})"),
        "loading (one rank's rows)": f"loading: a rank's rows ({master})",
        "logits": f"logits (token_stats {resolved_token_stats(c, shape.model_type)})",
        "activations": ("activations (checkpointed)" if c.checkpoints_activations
                        else "activations"),
        "vLLM weights": f"vLLM weights ({_short(c.sampler_dtype)}{tp_share})",
        "sampler weights": f"sampler weights ({_short(c.sampler_dtype)})",
        "sync buckets": f"sync buckets ({_short(c.sampler_dtype)})",
    }
    return labels.get(row, row)


def _short(dtype: str) -> str:
    return {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(dtype, dtype)


def memory_lines(c: GRPOSettings) -> list[str]:
    """`format_plan` for `explain`, or one line saying why there is none."""
    try:
        return format_plan(memory_plan(c), c)
    except Exception as error:  # noqa: BLE001  (explain must not fail on a missing model)
        reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
        return [f"memory plan: unavailable ({type(error).__name__}: {reason})"]
