"""Every GRPO knob in one table: type, default, unit, meaning and verl name.

`GRPOConfig` takes its GRPO-specific attributes from `GRPOSettings`; the
`verl` metadata maps verl's dotted config names onto them (one mechanism for
`explain`, the verl aliases of the command line and the docs).  The algorithm's
fields are declared in `rllib_grpo.rllib.config.algorithm_settings` (the first half, for
size), the system's here; `SETTINGS_FIELDS` is the one table of both.  No Ray here.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rllib_grpo.rllib.config.algorithm_settings import _ACTOR, _ROLLOUT, knob
from rllib_grpo.rllib.config.reward_settings import RewardSettings


@dataclass(frozen=True)
class BatchPlan:
    """The resolved sizes of one training step (units in the names)."""

    prompts_per_step: int
    trajectories_per_step: int
    prompts_per_minibatch: int
    trajectories_per_minibatch: int
    num_learners: int
    trajectories_per_learner: int
    trajectories_per_minibatch_per_learner: int
    micro_batch_size_per_learner: int
    micro_batches_per_minibatch: int
    minibatches_per_epoch: int
    optimizer_steps_per_step: int


@dataclass(eq=False, repr=False)  # GRPOConfig inherits these fields, not dataclass equality
class GRPOSettings(RewardSettings):
    """GRPO settings with their units; `GRPOConfig` inherits them as typed attributes.

    The algorithm's fields come from `AlgorithmSettings` (first, in its order), the
    rewards' from `RewardSettings`; the system's follow here.
    """

    # --- FSDP -----------------------------------------------------------------------
    fsdp: bool = knob(
        True, "flag", "With num_learners >= 2, shard the model over the learners with FSDP2 "
        "(per decoder layer); False = RLlib's DDP (a full replica per learner). LoRA runs "
        "(lora_rank > 0) always use DDP.")
    fsdp_param_dtype: str = knob(
        "auto", "dtype", "FSDP2 compute/all-gather dtype of the parameters: auto (= the compute "
        "dtype, model_dtype resolved) | model (the master weights' dtype) | bfloat16 | float16 | "
        "float32.")
    fsdp_reduce_dtype: str = knob(
        "float32", "dtype", "FSDP2 gradient reduce-scatter dtype: float32 | bfloat16 | model.",
        _ACTOR + "fsdp_config.mixed_precision.reduce_dtype")
    fsdp_cpu_offload: bool = knob(
        False, "flag", "Keep sharded parameters, gradients and optimizer states in host "
        "memory (FSDP2 CPUOffloadPolicy); the optimizer steps on the CPU.",
        (_ACTOR + "fsdp_config.offload_policy", _ACTOR + "fsdp_config.param_offload"))

    # --- LoRA and memory ------------------------------------------------------------
    lora_rank: int = knob(
        0, "rank", "LoRA rank through peft (0 = off, full fine-tuning). With LoRA only the "
        "adapter trains, the reference is the policy with the adapter disabled (no second "
        "copy of the weights) and checkpoints hold the adapter alone.",
        "actor_rollout_ref.model.lora_rank")
    lora_alpha: float = knob(
        16, "scalar", "LoRA alpha: the adapter's update is scaled by lora_alpha / lora_rank.",
        "actor_rollout_ref.model.lora_alpha")
    lora_target_modules: str | list = knob(
        "all-linear", "module names", "Layers that get an adapter: 'all-linear' (every linear "
        "layer but the output head) or a list of names such as ['q_proj', 'v_proj'].",
        "actor_rollout_ref.model.target_modules")
    lora_dropout: float = knob(
        0.0, "probability", "Dropout on the adapter's input, in the training forward only.")
    lora_sync: str = knob(
        "adapter", "mode", "What reaches the samplers after the first full sync: 'adapter' "
        "(the A and B matrices; each env runner merges W + B@A*alpha/r into its own copy) or "
        "'merged' (the learner sends the merged weights of the adapted layers).")
    ref_param_offload: bool = knob(
        False, "flag", "Keep the reference model in host memory (pinned on GPU machines) and "
        "move it to the learner's device once per reference pass (a no-op on CPU learners and "
        "with LoRA); under FSDP each learner keeps only its shard, and each layer visits the "
        "device for its forward.",
        "actor_rollout_ref.ref.fsdp_config.param_offload")
    optimizer_offload: bool = knob(
        False, "flag", "Keep AdamW's states in host memory between optimizer steps "
        "(verl actor.fsdp_config.optimizer_offload): moved to the device for the step, back "
        "after it (step hooks from rllib_grpo.models.offload.offload_optimizer_states, installed "
        "by the learner). A no-op on CPU.", _ACTOR + "fsdp_config.optimizer_offload")
    keep_freed_host_memory: bool = knob(
        True, "flag", "CPU learners: memory that tensors free stays in the process for the "
        "next step's tensors instead of going back to the kernel (glibc's malloc: no mmap "
        "for large blocks, no trim; rllib_grpo.models.host_memory). Spares the page faults "
        "of gigabytes of logits and activations every step (make demo-real: steps 7.0 -> "
        "6.0 s); the process's resident memory then stays at its peak, and the peak grows "
        "(SmolLM2 side by side with TRL: 7.4 -> 8.8 GB). A no-op on GPU learners and "
        "where the C library is not glibc.")
    token_stats: str | None = knob(
        None, "mode", "How the learner gets response log-probs and entropies from the "
        "model's last hidden states (rllib_grpo.models.lm_head). None = 'auto' where the "
        "learners hold GPUs (no full float32 copy of the logits), 'full' on CPUs "
        "(GRPOSettings.learner_token_stats). 'auto' = 'fused' where the "
        "model allows it (a plain llama / mistral / qwen2 / qwen3 head, no FSDP, no LoRA), "
        "else 'chunked'; 'fused' = chunks of tokens through the LM head with a hand-written "
        "backward, the full (tokens, vocabulary) logits never stored; 'chunked' = the model's "
        "logits, then the softmax statistics a chunk of tokens at a time; 'full' = one "
        "float32 log-softmax over all response logits under autograd. The same "
        "values to float32 rounding. On CPU at SmolLM2-135M's shape (49k vocabulary, ~1k "
        "response tokens) 'fused' saved ~200 MB and 6% of the forward + backward "
        "(benchmarks/learner_alternating.py), though alone the fused head was slower than "
        "the unchunked one (its backward recomputes the logits).")
    gpu_memory_gib: float = knob(
        79.2, "GiB", "Memory of one GPU as CUDA reports it (torch.cuda.mem_get_info's "
        "total; 79.2 on an 80 GB H100 or A100). The memory plan (explain, dry-run) checks "
        "every GPU's processes against it in each phase of a step, and a phase that does not "
        "fit is an error before Ray starts; explain and dry-run take --gpu-memory.")
    sampler_memory_fraction: float | None = knob(
        None, "fraction of GPU memory", "GPU memory the vLLM engine may take (weights + KV "
        "cache), vLLM's gpu_memory_utilization; None = sampler_config's value, else 0.5 when "
        "the engine shares the local learner's GPU (it sleeps during the update), else 0.9 x "
        "the env runner's GPU share when fractional, else vLLM's default (0.9).",
        _ROLLOUT + "gpu_memory_utilization")

    startup_timeout_s: float = knob(
        1800, "seconds", "How long a run's start may take: Tune's start of the trial, the "
        "placement group, the reward workers, the env runners with their engines and the "
        "learners, each placed and built (a 70B model loaded), before the run stops naming "
        "what it waits on, with every process's Python stack in a file (docs/hangs.md).")
    gpus_per_node: int = knob(
        0, "GPUs", "GPUs per node of the cluster the run is planned for (verl "
        "trainer.n_gpus_per_node): explain and dry-run print each GPU by node, and colocated "
        "engines of tensor parallel > 1 must tile whole nodes. 0 = not stated (one node in "
        "explain; the run tiles the nodes Ray gives it).")
    num_nodes: int = knob(
        0, "nodes", "Nodes of the cluster the run is planned for (verl trainer.nnodes); with "
        "gpus_per_node, a run that needs more GPUs than num_nodes x gpus_per_node (a reward "
        "model on a GPU of its own, say) is refused before Ray starts. 0 = not stated.")

    # --- weight sync ----------------------------------------------------------------
    weight_sync_transport: str = knob(
        "auto", "name", "How the learners' weights reach the samplers after each step: 'auto' "
        "(by placement: 'local' in one process; 'ipc' for a vLLM engine on the learners' GPUs, "
        "'nccl' for one on GPUs of its own, both vLLM's weight-transfer engines; 'shm' on the "
        "learner's node otherwise; 'object_store' beyond it, for LoRA and for the driver's "
        "env runner), or one of those forced: 'local' (device tensors copied in place), "
        "'ipc' (CUDA IPC buffers), 'nccl' (broadcast), 'shm' (one shared-memory copy on the "
        "node) or 'object_store' (a state dict through Ray, RLlib's way). explain prints "
        "what each env runner gets. Each call of a sync has the step's deadline "
        "(step_timeout_factor): an env runner past it is restarted and left out of the sync, "
        "a learner past it stops the run.")
    weight_sync_bucket_mb: float = knob(
        512, "MiB", "Size of the packed buffers of an 'ipc' or 'nccl' sync (vLLM's packed "
        "mode): each GPU holds at most two besides the model ('ipc': one, at least as large "
        "as the largest tensor).")

    # --- asynchronous rollouts (docs/async.md) -----------------------------------------
    max_staleness: int = knob(
        0, "learner updates", "0 = synchronous GRPO (sample, update, sync in turn). K >= 1 = "
        "one-step-off-policy: the remote env runners generate the next step's groups while "
        "the learner trains on the current ones, and get the new weights between two "
        "generations; no trajectory older than K learner updates is trained on (its group is "
        "dropped and sampled again, counted in async/dropped_stale_groups). Needs "
        "num_env_runners >= 1. In-flight samples are not checkpointed: a restored run samples "
        "those prompts again. With rollout_mode='continuous' K bounds every trained token's "
        "staleness and sets how many steps of groups are in flight.")
    rollout_mode: str = knob(
        "auto", "name", "'auto' ('sync' at max_staleness=0, else 'one_step_off') | 'sync' | "
        "'one_step_off' (the next step's groups sampled during the update; weights between "
        "generations) | 'continuous' (env runners never stop: up to max_staleness steps' worth "
        "of groups in flight, finished groups stream to the learner, weights loaded between "
        "two decode steps; vLLM sampler, single-turn envs).")
    partial_rollout: bool = knob(
        True, "bool", "rollout_mode='continuous': a response unfinished at a weight update "
        "continues under the new weights (each token keeps the version that sampled it); "
        "False samples it again from its prompt.")

    def resolved_rollout_mode(self) -> str:
        """``rollout_mode`` with 'auto' resolved from ``max_staleness``."""
        if self.rollout_mode != "auto":
            return self.rollout_mode
        return "one_step_off" if self.max_staleness else "sync"

    # --- reporting ------------------------------------------------------------------
    peak_tflops: float | None = knob(
        None, "TFLOP/s per learner device", "Peak of one learner device for perf/mfu/actor "
        "(6 x parameters x training tokens/s / peak); None = the bf16 dense peak of known GPUs "
        "by name (rllib_grpo.rllib.learner.perf), and no MFU on CPUs or unknown devices.")
    loggers: tuple = knob(
        ("console", "tensorboard"), "names", "Where `rllib train` logs metrics: console, "
        "tensorboard, wandb, mlflow (Tune's logger callbacks; wandb and mlflow need their "
        "package installed).", "trainer.logger")
    log_completions_every: int = knob(
        0, "training steps", "Write sampled completions to TensorBoard every N steps (0 = off).")
    warn_no_signal_after: int = knob(
        3, "training steps", "Warn when most groups carry no signal for this many steps.")

    # --- checkpoints and faults -------------------------------------------------------
    keep_checkpoints: int = knob(
        0, "checkpoints", "Keep only this run's newest K checkpoints in the folder "
        "save_to_path writes to (0 = keep all); `rllib train` also passes it to Tune as "
        "num_to_keep. Checkpoints are written atomically with a manifest of checksums.")
    max_skipped_steps: int = knob(
        10, "training steps", "Stop the run when this many training steps in a row learned "
        "nothing: every optimizer step skipped for a non-finite gradient norm, or every "
        "reward call failed (0 = never stop).")
    step_timeout_factor: float = knob(
        10.0, "x median", "A wait of a training step (an env runner's sampling, the learners' "
        "update, an evaluation, a checkpoint write, a weight sync) may last this many times "
        "the median of the same wait so far, at least step_timeout_floor_s. Past it the run "
        "names the stuck process and writes every process's Python stack to the trial "
        "folder; a stuck env runner is restarted and its share sampled again, anything else "
        "stops the run (docs/hangs.md).")
    step_timeout_floor_s: float = knob(
        3600.0, "seconds", "The least time a wait of a training step gets before it counts "
        "as a hang (step_timeout_factor), and the whole deadline of the first wait of each "
        "kind, which has no median yet: long enough for a slow first step of a large "
        "model.")
    env_runner_restart_timeout_s: float = knob(
        600.0, "seconds", "How long a training step whose remote env runners are all lost "
        "waits for Ray to restart one (restart_failed_env_runners) before it fails; with a "
        "healthy runner left, the lost share is sampled there at once.")

    if TYPE_CHECKING:
        # RLlib's own fields that GRPO's checks and plans read: `AlgorithmConfig` holds them
        # at run time (`GRPOConfig` inherits both); declared for the type checker only, so
        # the checks can be typed with this class.  Not GRPO settings: not in the table.
        num_env_runners: int = 0
        num_learners: int = 0
        num_gpus_per_learner: float = 0
        num_gpus_per_env_runner: float = 0
        num_cpus_per_learner: float | str = "auto"
        num_cpus_per_env_runner: float = 1
        num_cpus_for_main_process: float = 1
        placement_strategy: str = "PACK"
        num_epochs: int = 1
        shuffle_batch_per_epoch: bool = False
        lr: Any = None
        env: Any = None
        seed: int | None = None

    # ---------------------------------------------------------------- derived values
    @property
    def learners_on_gpus(self) -> bool:
        """The learners hold GPUs (``num_gpus_per_learner > 0``): the one switch between the
        CPU and the GPU defaults of ``model_dtype``, ``use_dynamic_bsz``, ``token_stats`` and
        ``gradient_checkpointing``."""
        return (getattr(self, "num_gpus_per_learner", 0) or 0) > 0

    @property
    def compute_dtype(self) -> str:
        """``model_dtype`` resolved: ``auto`` is bfloat16 (over fp32 master weights, as verl)
        when the learners hold GPUs, float32 on CPUs (bf16 matmuls are slow there)."""
        if self.model_dtype != "auto":
            return self.model_dtype
        return "bfloat16" if self.learners_on_gpus else "float32"

    @property
    def micro_batches_by_tokens(self) -> bool:
        """``use_dynamic_bsz`` resolved: None is a token budget per micro-batch on GPU
        learners (verl's examples; one micro-batch of a whole mini-batch runs out of memory
        there) unless ``micro_batch_size_per_learner`` is set; whole mini-batches on CPUs."""
        if self.use_dynamic_bsz is not None:
            return bool(self.use_dynamic_bsz)
        return self.learners_on_gpus and self.micro_batch_size_per_learner is None

    @property
    def learner_token_stats(self) -> str:
        """``token_stats`` resolved: None is 'auto' on GPU learners (chunked log-softmax and
        entropy, no full float32 copy of the logits), 'full' on CPUs."""
        if self.token_stats is not None:
            return self.token_stats
        return "auto" if self.learners_on_gpus else "full"

    @property
    def checkpoints_activations(self) -> bool:
        """``gradient_checkpointing`` resolved: None is on for GPU learners where the memory
        plan's activations of one micro-batch are the update's largest item
        (`rllib_grpo.rllib.config.learner_memory.activations_dominate`; on where the model's
        shape is unknown), off on CPUs."""
        if self.gradient_checkpointing is not None:
            return bool(self.gradient_checkpointing)
        if not self.learners_on_gpus:
            return False
        from rllib_grpo.rllib.config.learner_memory import activations_dominate, config_shape

        try:
            shape = config_shape(self)
        except Exception:  # noqa: BLE001  (no shape to plan with: the safe side)
            return True
        return activations_dominate(self, shape)

    @property
    def sampler_dtype(self) -> str:
        """The samplers' weight dtype: ``sampler_config["dtype"]`` if set (and not "auto"),
        else the compute dtype; weight syncs are cast to it on the learner."""
        dtype = canonical_dtype(dict(self.sampler_config).get("dtype") or "auto")
        return self.compute_dtype if dtype == "auto" else dtype

    @property
    def sampler_sleeps(self) -> bool:
        """The vLLM engines share the learners' GPUs (`layout.shares_learner_gpus`: the
        local env runner with the local learner on a GPU, or verl's colocated layout), so
        they sleep during each update (KV cache and weights released) and wake before the
        weight sync."""
        from rllib_grpo.rllib.config.gpu_layout import shares_learner_gpus

        return self.sampler != "hf" and shares_learner_gpus(self)

    @property
    def needs_reference(self) -> bool:
        """A frozen reference model is needed when any KL term is on."""
        return bool(self.use_kl_loss or self.use_kl_in_reward)

    def validation_sampling(self) -> Any:
        """verl's ``val_kwargs``: greedy unless ``val_do_sample`` (None: sample when
        ``val_temperature > 0``), then ``val_temperature``/``val_top_p``/``val_top_k``."""
        from rllib_grpo.samplers import SamplingParams

        sample = self.val_do_sample if self.val_do_sample is not None else self.val_temperature > 0
        if not sample:
            return SamplingParams(temperature=0.0, max_tokens=self.max_response_length)
        return SamplingParams(temperature=self.val_temperature, top_p=self.val_top_p,
                              top_k=self.val_top_k, max_tokens=self.max_response_length)

    @property
    def loss_horizon(self) -> float:
        """Horizon of seq-mean-token-sum-norm (verl `loss_scale_factor`)."""
        return float(self.loss_scale_factor or self.max_response_length)

    def batch_plan(self) -> BatchPlan:
        """Resolve the sizes of a training step (does not validate them)."""
        num_learners = max(1, self.num_learners)
        prompts_mb = self.prompts_per_minibatch or self.prompts_per_step
        traj_step = self.prompts_per_step * self.group_size
        traj_mb = prompts_mb * self.group_size
        traj_mb_learner = traj_mb // num_learners
        micro = self.micro_batch_size_per_learner or traj_mb_learner
        minibatches = self.prompts_per_step // prompts_mb if prompts_mb else 0
        return BatchPlan(
            prompts_per_step=self.prompts_per_step,
            trajectories_per_step=traj_step,
            prompts_per_minibatch=prompts_mb,
            trajectories_per_minibatch=traj_mb,
            num_learners=num_learners,
            trajectories_per_learner=traj_step // num_learners,
            trajectories_per_minibatch_per_learner=traj_mb_learner,
            micro_batch_size_per_learner=micro,
            micro_batches_per_minibatch=max(1, traj_mb_learner // micro) if micro else 0,
            minibatches_per_epoch=minibatches,
            optimizer_steps_per_step=minibatches * self.num_epochs,
        )


# verl's spellings of a dtype (verl.utils.torch_dtypes.PrecisionType) -> ours.
DTYPE_SPELLINGS = {"fp32": "float32", "32": "float32", "float32": "float32",
                   "bf16": "bfloat16", "bfloat16": "bfloat16",
                   "fp16": "float16", "16": "float16", "float16": "float16"}


def canonical_dtype(value: Any) -> Any:
    """``"bf16"``/``"fp32"``/... -> ``"bfloat16"``/``"float32"``; anything else unchanged
    (the checks name the field of an unknown one)."""
    return DTYPE_SPELLINGS.get(str(value).lower(), value) if isinstance(value, str | int) \
        and not isinstance(value, bool) else value


def is_dtype_setting(name: str) -> bool:
    """A setting whose value is a dtype name (unit ``dtype``)."""
    field_ = SETTINGS_FIELDS.get(name)
    return field_ is not None and field_.metadata["unit"] == "dtype"


# Settings the RLModule receives in its model_config (LoRA and memory levers).
MODULE_SETTINGS = ("lora_rank", "lora_alpha", "lora_target_modules", "lora_dropout", "lora_sync",
                   "ref_param_offload", "use_remove_padding",
                   "share_prompt_prefix", "freeze_vision_tower")

SETTINGS_FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(GRPOSettings)
}

# Unit-bearing verl names that differ from ours (verl name -> our name).
VERL_ALIASES: dict[str, str] = {
    verl_name: name
    for name, f in SETTINGS_FIELDS.items()
    for verl_name in f.metadata["verl"]
}
# verl names that map onto RLlib's own AlgorithmConfig attributes.
VERL_ALIASES.update({
    _ACTOR + "optim.lr": "lr",
    _ACTOR + "ppo_epochs": "num_epochs",
    _ACTOR + "grad_clip": "grad_clip",
    _ACTOR + "shuffle": "shuffle_batch_per_epoch",
    "algorithm.gamma": "gamma",
})


# RLlib fields that GRPO derives from its own settings (refused by name from Python and
# from the command line), with the formula.
DERIVED_FIELDS: dict[str, str] = {
    "train_batch_size": "prompts_per_step x group_size",
    "train_batch_size_per_learner": "prompts_per_step x group_size / num_learners",
    "minibatch_size": "prompts_per_minibatch x group_size",
}


def derived_field_error(name: str) -> str:
    """The message refusing the derived field ``name``."""
    return (f"{name!r} is derived for GRPO ({DERIVED_FIELDS[name]}); set prompts_per_step, "
            "prompts_per_minibatch or group_size instead.")


# `loggers` names -> the package each needs (console and TensorBoard come with Ray).
LOGGER_PACKAGES: dict[str, str | None] = {"console": None, "tensorboard": None,
                                          "wandb": "wandb", "mlflow": "mlflow"}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` Did you mean 'group_size'?`` for a misspelt ``name`` (difflib's nearest among
    ``known``, up to three), or ``""`` when none is near."""
    near = difflib.get_close_matches(name, sorted(set(known)), n=3, cutoff=0.75)
    return f" Did you mean {' or '.join(map(repr, near))}?" if near else ""


def choice_error(field: str, value: Any, choices: Iterable[Any], *, listed: str | None = None,
                 note: str = "") -> str | None:
    """The one refusal of every choice-valued setting, or None when ``value`` is one of
    ``choices``: ``field='x' is unknown; use one of: a, b (note). Did you mean 'a'?``.
    ``listed`` replaces the list of choices shown (where they are many and follow a rule);
    the suggestion is the nearest of all of them (`did_you_mean`)."""
    choices = tuple(choices)
    if value in choices:
        return None
    shown = listed if listed is not None else ", ".join(map(str, choices))
    return (f"{field}={value!r} is unknown; use one of: {shown}{note}."
            + did_you_mean(str(value), [str(choice) for choice in choices]))


def settings_table() -> str:
    """Every GRPO setting as a Markdown table: name, type, default, unit, verl name, meaning."""
    rows = ["| field | type | default | unit | verl | meaning |", "|---|---|---|---|---|---|"]
    for name, f in SETTINGS_FIELDS.items():
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        verl = ", ".join(f"`{v}`" for v in f.metadata["verl"])
        doc, kind = (str(text).replace("|", "\\|") for text in (f.metadata["doc"], f.type))
        rows.append(f"| `{name}` | `{kind}` | `{default!r}` | {f.metadata['unit']} | {verl} "
                    f"| {doc} |")
    return "\n".join(rows) + "\n"


CONFIGURATION_DOC_HEADER = """# Configuration: every GRPO field

Generated from `rllib_grpo/rllib/config/settings.py` and `algorithm_settings.py` (the one source
of truth) by
`python -m rllib_grpo.rllib.config.settings > docs/configuration.md`; `tests/rllib/config/test_config.py`
checks that this file is up to date.  `GRPOConfig` inherits these fields as typed
attributes; `.training(...)` sets them (and RLlib's own: `lr`, `grad_clip`, `num_epochs`,
...); the verl names are accepted as aliases in Python, YAML and on the command line.
RLlib's `train_batch_size`, `train_batch_size_per_learner` and `minibatch_size` are derived
from `prompts_per_step`, `prompts_per_minibatch` and `group_size` and refused by name.
RLlib's `create_local_env_runner` is, unless set, True only with `num_env_runners=0`: GRPO
samples and validates on the remote env runners wherever there are any, so the driver holds
no sampler (a model copy, a vLLM engine) beside them.

**CPU and GPU defaults.** Four settings default to a value that depends on where the
learners run, decided in one place (`GRPOSettings.learners_on_gpus`: `num_gpus_per_learner
> 0`) and printed by `rllib-grpo explain` ("learner memory settings"):

| setting | GPU learners | CPU learners |
|---|---|---|
| `model_dtype` (`auto`) | bfloat16 compute over fp32 master weights | float32 |
| `use_dynamic_bsz` (`None`) | a token budget per micro-batch (`max_tokens_per_micro_batch`), unless `micro_batch_size_per_learner` is set | whole mini-batches |
| `token_stats` (`None`) | `'auto'`: chunked (or fused) log-softmax and entropy, no full float32 copy of the logits | `'full'` |
| `gradient_checkpointing` (`None`) | on where the memory plan's activations of one micro-batch are the update's largest item (above the weights, gradients, AdamW states, reference and logits each) | off |

A value set explicitly is kept.  On GPUs the memory plan (`rllib_grpo.rllib.config.memory`,
docs/gpus.md) checks every GPU against `gpu_memory_gib` before Ray starts.

"""


def configuration_doc() -> str:
    """The text of ``docs/configuration.md``: a short header and `settings_table`."""
    return CONFIGURATION_DOC_HEADER + settings_table()


def defaults() -> dict[str, Any]:
    """Fresh default values of every GRPO setting."""
    return dataclasses.asdict(GRPOSettings())


if __name__ == "__main__":
    print(configuration_doc(), end="")
