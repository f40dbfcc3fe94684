"""verl's configuration keys that are not plain aliases of a GRPO setting, by how they are
taken (`rllib_grpo.cli.config_keys.translate` reads these tables), and verl's defaults.

A verl key with a real mapping onto a setting is a `VERL_ALIASES` entry (settings.py);
the tables here hold the rest: keys accepted without effect (with the reason), keys that
set how the experiment runs, dict entries, values recorded for later, and the parallel
layouts this package cannot run (refused with the reason and the nearest setting).
"""

from __future__ import annotations

from typing import Any

from rllib_grpo.rllib.config.settings import VERL_ALIASES

_AR = "actor_rollout_ref."
_LOGPROB_CHUNKS = ("chunking of a no-grad log-prob forward pass: the values do not depend on it "
                   "(the learner chunks it by micro_batch_size_per_learner)")
_ULYSSES = ("Ulysses sequence parallelism (each sequence split over several GPUs) is not "
            "implemented: every learner holds whole sequences")
_MEGATRON = ("verl's Megatron engine (tensor/pipeline-parallel actor) is not available: the "
             "learners are data-parallel, sharding the model with FSDP2 over num_learners = "
             "n_gpus_per_node x nnodes GPUs")
_MEGATRON_FIX = ("drop model_engine=megatron and the *.megatron.* keys: FSDP2 shards the same "
                 "model over the same GPUs (set actor_rollout_ref.actor.fsdp_config."
                 "param_offload=True if it does not fit)")

# verl keys accepted at any value because they change nothing here: key -> why.
VERL_IGNORED: dict[str, str] = {
    "trainer.project_name": "the wandb project name; names nothing here",
    "trainer.balance_batch": "verl reorders trajectories for equal GPU work: it changes which "
                             "trajectories share a mini-batch, not the objective, advantages or "
                             "expected update",
    "trainer.log_val_generations": "verl prints this many validation generations; validation "
                                   "here logs verl's val-core metrics only (log_completions_every "
                                   "writes training completions to TensorBoard)",
    _AR + "actor.use_torch_compile": "torch.compile of verl's log-prob kernels: a speed path",
    _AR + "actor.fsdp_config.fsdp_size": "verl's hybrid-shard group size: the same update, other "
                                         "memory and traffic; here FSDP2 shards over all learners",
    _AR + "rollout.mode": "verl's rollout server mode; a step's samples all come from one weight "
                          "version either way",
    _AR + "rollout.free_cache_engine": "verl sleeps the engine between rollouts to share GPUs "
                                       "with training; engines here sleep whenever they "
                                       "share the learners' GPUs (sampler_sleeps)",
    _AR + "rollout.load_format": "how verl's engine loads its first weights; samplers here load "
                                 "the model, then receive the learner's weights every step",
    _AR + "rollout.calculate_log_probs": "samplers here always return the rollout log-probs",
    _AR + "rollout.checkpoint_engine.update_weights_bucket_megabytes":
        "bucket size of verl's weight transfer: a transport detail",
    _AR + "rollout.log_prob_micro_batch_size_per_gpu": _LOGPROB_CHUNKS,
    _AR + "rollout.log_prob_max_token_len_per_gpu": _LOGPROB_CHUNKS,
    _AR + "rollout.log_prob_use_dynamic_bsz": _LOGPROB_CHUNKS,
    _AR + "ref.log_prob_micro_batch_size_per_gpu": _LOGPROB_CHUNKS,
    _AR + "ref.log_prob_max_token_len_per_gpu": _LOGPROB_CHUNKS,
    _AR + "ref.log_prob_use_dynamic_bsz": _LOGPROB_CHUNKS,
    _AR + "rollout.multi_turn.enable": "multi-turn is the env's property (env.multi_turn): a "
                                       "multi-turn env plays several turns, others one",
    _AR + "rollout.multi_turn.format": "tool calls are parsed in both <tool> and Hermes "
                                       "<tool_call> JSON formats (docs/multi_turn.md)",
    "data.return_raw_chat": "prompts are rendered with the tokenizer's chat template in the env",
    "reward_model.overlong_buffer.log": "overlong_reward and overlong are always recorded in "
                                        "each sample's info",
    "reward_model.reward_kwargs.overlong_buffer_cfg.log": "overlong_reward and overlong are "
                                                          "always recorded in each sample's info",
    _AR + "actor.optim.total_training_steps": "verl overwrites it with the run's length "
                                              "(total_training_steps here)",
    _AR + "rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache":
        "vLLM's cache of processed images (a memory/speed detail: samples do not change); "
        "vLLM >= 0.11 calls it mm_processor_cache_gb: sampler_config.mm_processor_cache_gb=0 "
        "disables it",
}
# Key prefixes accepted at any value: prefix -> why.
VERL_IGNORED_PREFIXES: dict[str, str] = {
    "ray_kwargs.": "how verl's launcher starts Ray; rllib train takes --ray-address, --num-cpus "
                   "and --num-gpus",
    "global_profiler.": "verl's profiler; use Ray's or torch's profilers here",
}
# verl keys accepted only at the value that is what rllib-grpo does: key -> (value or tuple
# of values, why).
VERL_IGNORED_AT: dict[str, tuple[Any, str]] = {
    "trainer.critic_warmup": (0, "GRPO has no critic"),
    _AR + "actor.fsdp_config.mixed_precision.buffer_dtype": (
        "float32", "buffers (rotary tables) stay in the fp32 master weights' dtype"),
}
# Parallel layouts that cannot run here: key -> (values that are fine, why, nearest setting).
VERL_REFUSED_LAYOUTS: dict[str, tuple[tuple[Any, ...], str, str]] = {
    **{_AR + role + key: ((1, None), _ULYSSES,
                          f"{_AR}{role}{key}=1; to bound memory use use_dynamic_bsz=True with "
                          "actor_rollout_ref.actor.ppo_max_token_len_per_gpu, "
                          "gradient checkpointing and fsdp_config.param_offload=True")
       for role in ("actor.", "ref.", "actor.fsdp_config.", "ref.fsdp_config.")
       for key in ("ulysses_sequence_parallel_size",)},
    "model_engine": (("dp", "fsdp"), _MEGATRON, _MEGATRON_FIX),
    _AR + "actor.strategy": (("fsdp", "fsdp2"), _MEGATRON, _MEGATRON_FIX),
    _AR + "ref.strategy": (("fsdp", "fsdp2"), _MEGATRON, _MEGATRON_FIX),
}
VERL_REFUSED_PREFIXES: dict[str, tuple[str, str]] = {
    _AR + "actor.megatron.": (_MEGATRON, _MEGATRON_FIX),
    _AR + "ref.megatron.": (_MEGATRON, _MEGATRON_FIX),
}
# verl keys that set how the experiment runs (Tune), not the algorithm config.
VERL_TO_RUN: dict[str, str] = {
    "trainer.total_training_steps": "stop training_iteration (and total_training_steps)",
    "trainer.total_epochs": "stop training_iteration = epochs x (prompts // prompts_per_step)",
    "trainer.save_freq": "checkpoint frequency (training steps; -1 = none)",
    "trainer.experiment_name": "Tune experiment name",
    "trainer.default_local_dir": "Tune storage path",
    "trainer.n_gpus_per_node": "verl's colocated layout: one learner per GPU, GPUs / rollout TP "
                               "engines on the same GPUs (rllib_grpo.rllib.config.gpu_layout)",
    "trainer.nnodes": "verl's colocated layout: one learner per GPU, GPUs / rollout TP engines "
                      "on the same GPUs (rllib_grpo.rllib.config.gpu_layout)",
}
# verl keys recorded with the experiment and shown by explain: key -> what becomes of them.
VERL_RECORDED: dict[str, str] = {
    "trainer.resume_mode": "recorded; resuming (auto/disable/resume_path) is not wired to the "
                           "command line yet: restore with GRPO.from_checkpoint",
    "trainer.resume_from_path": "recorded with trainer.resume_mode",
    "reward_model.reward_manager": "naive and dapo score each sample the same way here; "
                                   "overlong shaping follows reward_model.overlong_buffer.*",
}
REWARD_MANAGERS = ("naive", "dapo", "prime")
# verl's own way to plug a reward function (newer verl nests it under ``reward.``):
# ``path`` (a .py file), ``name`` (default below) and ``reward_kwargs.*`` become
# ``env_config.reward_fn = "path:name"`` and ``env_config.reward_kwargs``.
VERL_CUSTOM_REWARD_PREFIXES = ("custom_reward_function.", "reward.custom_reward_function.")
VERL_CUSTOM_REWARD_ENTRIES = ("path", "name", "reward_kwargs")
VERL_CUSTOM_REWARD_NAME = "compute_score"
# verl keys that set one entry of a dict-valued config field: key -> (field, entry).
VERL_TO_SUB_KEY: dict[str, tuple[str, str]] = {
    "data.train_files": ("env_config", "path"),
    "data.val_files": ("val_env_config", "path"),
    "data.prompt_key": ("env_config", "prompt_key"),
    "data.image_key": ("env_config", "image_key"),  # the column of a row's images
    _AR + "rollout.enforce_eager": ("sampler_config", "enforce_eager"),
    _AR + "rollout.dtype": ("sampler_config", "dtype"),  # the samplers' weight dtype
    _AR + "rollout.tensor_model_parallel_size": ("sampler_config", "tensor_parallel_size"),
    _AR + "rollout.enable_chunked_prefill": ("sampler_config", "enable_chunked_prefill"),
    _AR + "rollout.max_num_batched_tokens": ("sampler_config", "max_num_batched_tokens"),
    _AR + "rollout.max_num_seqs": ("sampler_config", "max_num_seqs"),
    _AR + "rollout.enable_prefix_caching": ("sampler_config", "enable_prefix_caching"),
}
# verl key prefixes whose rest names an entry of a dict field: prefix -> field.
VERL_PREFIX_TO_DICT: dict[str, str] = {
    _AR + "model.override_config.": "model_override_config",
}
# verl keys whose value must equal a setting (verl takes the setting from them): key -> field.
VERL_MUST_MATCH: dict[str, str] = {
    "reward_model.reward_kwargs.max_resp_len": "max_response_length",
}
# Top-level verl keys (Hydra config groups) that carry no section prefix.
VERL_TOP_LEVEL = ("model_engine",)

# verl's defaults where they differ from GRPOConfig(): field -> (value, verl key).  A
# configuration given in verl's keys starts from these (explain lists them).
VERL_DEFAULTS: dict[str, tuple[Any, str]] = {
    "prompts_per_step": (1024, "data.train_batch_size"),
    "group_size": (1, _AR + "rollout.n"),
    "prompts_per_minibatch": (256, _AR + "actor.ppo_mini_batch_size"),
    "use_kl_loss": (False, _AR + "actor.use_kl_loss"),
    "lr_warmup_steps": (-1, _AR + "actor.optim.lr_warmup_steps"),
    "max_num_gen_batches": (0, "algorithm.filter_groups.max_num_gen_batches"),
    "overlong_buffer_enable": (False, "reward_model.overlong_buffer.enable"),
    "overlong_penalty_factor": (0.0, "reward_model.overlong_buffer.penalty_factor"),
    "val_before_train": (True, "trainer.val_before_train"),
    "val_do_sample": (False, _AR + "rollout.val_kwargs.do_sample"),
    "sampler_memory_fraction": (0.5, _AR + "rollout.gpu_memory_utilization"),
    # bf16 compute over fp32 master weights (fsdp_config.model_dtype, verl's fp32 default).
    "model_dtype": ("bfloat16", _AR + "actor.fsdp_config.mixed_precision.param_dtype"),
}
VERL_DEFAULT_EPOCHS = 30  # trainer.total_epochs, when no stop is given
# verl defaults not taken, and why (explain prints them with the defaults above).
VERL_DEFAULTS_NOT_TAKEN: dict[str, str] = {
    "algorithm.adv_estimator=gae": "PPO with a critic, which this package has no; grpo is used "
                                   "(set algorithm.adv_estimator)",
    "trainer.n_gpus_per_node=8, trainer.nnodes=1": "the machine's size; resources come from "
                                                  "these keys only when given",
    _AR + "rollout.tensor_model_parallel_size=2": "given, it sets tensor_parallel_size (and, "
                                                  "with trainer.n_gpus_per_node, the number "
                                                  "of colocated engines)",
    "data.train_files=~/data/rlhf/gsm8k/train.parquet": "the env's own data is used unless "
                                                        "data.train_files is given",
}


def known_verl_keys() -> list[str]:
    """Every verl key taken by name (the aliases of settings.py and the tables here): the
    candidates for a misspelt verl key's nearest names."""
    tables: list[Any] = [VERL_ALIASES, VERL_IGNORED, VERL_IGNORED_AT, VERL_REFUSED_LAYOUTS,
                         VERL_TO_RUN, VERL_RECORDED, VERL_TO_SUB_KEY, VERL_MUST_MATCH,
                         VERL_TOP_LEVEL]
    custom = [p + e for p in VERL_CUSTOM_REWARD_PREFIXES for e in VERL_CUSTOM_REWARD_ENTRIES]
    return sorted({key for table in tables for key in table} | set(custom))


def prefix_match(key: str, table: dict[str, Any]) -> str | None:
    """The entry of ``table`` whose prefix ``key`` starts with, if any."""
    return next((prefix for prefix in table if key.startswith(prefix)), None)
