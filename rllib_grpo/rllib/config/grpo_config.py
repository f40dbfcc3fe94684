"""`GRPOConfig`: RLlib's fluent `AlgorithmConfig` with every GRPO knob of verl.

The GRPO-specific fields, their units and verl names live in
`rllib_grpo.rllib.config.settings.GRPOSettings`; this class carries them as attributes, sets
them from `.training(...)`, resolves the batch plan, and validates it.

    config = (
        GRPOConfig()
        .environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
        .training(prompts_per_step=16, group_size=8, lr=1e-3)
    )
    algo = config.build_algo()
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig, NotProvided
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.utils.annotations import override
from ray.rllib.utils.serialization import deserialize_type

from rllib_grpo.rllib.config.gpu_layout import PlacementPlan
from rllib_grpo.rllib.config.settings import (
    DERIVED_FIELDS,
    EVALUATION_ALIASES,
    MODULE_SETTINGS,
    SETTINGS_FIELDS,
    VERL_ALIASES,
    WHOLE_HELD_OUT_SET,
    GRPOSettings,
    canonical_dtype,
    defaults,
    derived_field_error,
    did_you_mean,
    is_dtype_setting,
)

# The classes a GRPO run is made of, by import path (RLlib resolves learner classes by path
# too): the config sits below the learner's and the env runner's rooms, which import it.
LEARNER = "rllib_grpo.rllib.learner.learner.GRPOLearner"
FSDP_LEARNER = "rllib_grpo.rllib.learner.fsdp.FSDPGRPOLearner"
LEARNER_GROUP = "rllib_grpo.rllib.learner.learner_group.GRPOLearnerGroup"
RL_MODULE = "rllib_grpo.rllib.learner.module.CausalLMRLModule"
ENV_RUNNER = "rllib_grpo.rllib.env_runner.env_runner.TextEnvRunner"
ALGORITHM = "rllib_grpo.rllib.algorithm.grpo.GRPO"
# The algorithm stores its run's placement group on its (frozen) config under this name, for
# the learner group it builds (`GRPOConfig.build_learner_group`).
RUN_PLACEMENT_GROUP = "_run_placement_group"
# RLlib's own `training()` arguments (a typo among them gets the nearest names).
_RLLIB_TRAINING_KEYS = frozenset(inspect.signature(AlgorithmConfig.training).parameters) - {"self"}
TEXT_SPACE = gym.spaces.Text(max_length=1 << 16, charset="".join(map(chr, range(32, 127))) + "\n")


class InstanceField:
    """An RLlib field whose value stays in the instance's ``__dict__`` under the field's
    name, where RLlib's ``to_dict`` and ``get_state`` look for it and pickling carries it;
    a subclass says what a read returns (`held` is the value as stored)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __set__(self, config: Any, value: Any) -> None:
        config.__dict__[self.name] = value

    def held(self, config: Any) -> Any:
        return config.__dict__.get(self.name)


class ClassByPath(InstanceField):
    """A class-valued RLlib field held as its import path (``"pkg.module.Class"``) until
    first read, then as the class.

    The algorithm and the env runner import transformers: held by path, ``GRPOConfig()``
    costs RLlib's import only, and a CPU run imports the rest while Ray starts
    (`rllib_grpo.rllib.cpu_tuning.cpu_start_up`).  A config pickled to a worker carries
    the path.
    """

    def __get__(self, config: Any, owner: type | None = None) -> Any:
        if config is None:
            return self
        value = self.held(config)
        if isinstance(value, str):
            value = config.__dict__[self.name] = deserialize_type(value, error=True)
        return value

    @staticmethod
    def path(config: Any, name: str) -> str | None:
        """The import path ``config`` holds for field ``name``, or None once resolved."""
        value = config.__dict__.get(name)
        return value if isinstance(value, str) else None


class LocalEnvRunnerWhereItSamples(InstanceField):
    """RLlib's ``create_local_env_runner`` for GRPO: unset (None), True exactly when there
    are no remote env runners.

    GRPO samples and validates on the remote env runners wherever there are any, so an env
    runner in the driver beside them (RLlib's default) would hold a sampler that never
    samples (a model copy, or a whole vLLM engine) and take every weight sync.  An explicit
    value (``.env_runners(create_local_env_runner=...)``) is kept
    (`layout.explicit_local_env_runner` reads it).  Unset travels as None, so an evaluation
    copy (its own ``num_env_runners``) decides for itself.
    """

    def __get__(self, config: Any, owner: type | None = None) -> Any:
        if config is None:
            return self
        value = self.held(config)
        return config.num_env_runners == 0 if value is None else bool(value)


class GRPOConfig(AlgorithmConfig, GRPOSettings):
    """Configuration of the GRPO algorithm.

    Every GRPO field is declared (with its type, unit and doc) in `GRPOSettings`, which this
    class inherits, so IDEs and type checkers see ``config.group_size`` and its siblings;
    ``docs/configuration.md`` lists them all.  RLlib's own fields (``lr``, ``grad_clip``,
    ``num_epochs``, ...) keep their meaning.  Fields derived from the batch plan
    (`DERIVED_FIELDS`) are refused by name.
    """

    # Both imported on first read (`ClassByPath`): the algorithm class imports this module.
    algo_class = ClassByPath()
    env_runner_cls = ClassByPath()
    # The driver's env runner only where no remote one samples (unless set explicitly).
    create_local_env_runner = LocalEnvRunnerWhereItSamples()

    def __init__(self, algo_class: type | None = None) -> None:
        AlgorithmConfig.__init__(self, algo_class=algo_class or ALGORITHM)
        for name, value in defaults().items():
            setattr(self, name, value)
        # RLlib fields with GRPO/verl defaults.
        self.lr = 1e-6
        self.gamma = 1.0
        self.grad_clip = 1.0
        self.grad_clip_by = "global_norm"
        self.num_epochs = 1
        self.shuffle_batch_per_epoch = False
        self.num_env_runners = 0
        self.create_local_env_runner = None  # unset: see `LocalEnvRunnerWhereItSamples`
        self.observation_space = TEXT_SPACE
        self.action_space = TEXT_SPACE
        self.env_runner_cls = ENV_RUNNER
        self.env = "rllib_grpo/Arithmetic-v0"
        # Held-out prompts per evaluation: by default the whole set, once (verl); RLlib's
        # default (10 episodes) would cut it short, and RLlib wants an int here.
        self.evaluation_duration = WHOLE_HELD_OUT_SET
        # The runners carry no connector state; the data position is checkpointed instead.
        self._dont_auto_sync_env_runner_states = True

    # ---------------------------------------------------------------- fluent setters
    @override(AlgorithmConfig)
    def training(self, **kwargs: Any) -> GRPOConfig:
        """Set training fields: any GRPO setting (see `GRPOSettings`) or RLlib's own
        (`lr`, `grad_clip`, `num_epochs`, ...; and the evaluation fields by their verl-style
        names, `EVALUATION_ALIASES`).  verl's dotted names are accepted too."""
        grpo_kwargs = {}
        for key in list(kwargs):
            name = VERL_ALIASES.get(key, key)
            if name in DERIVED_FIELDS and kwargs[key] is not NotProvided:
                raise ValueError(derived_field_error(name))
            if name in SETTINGS_FIELDS or name in EVALUATION_ALIASES:
                value = kwargs.pop(key)
                grpo_kwargs[name] = canonical_dtype(value) if is_dtype_setting(name) else value
            elif name != key:
                kwargs[name] = kwargs.pop(key)
            elif name not in _RLLIB_TRAINING_KEYS:
                raise TypeError(f"training() got an unknown setting {key!r}." + did_you_mean(
                    key, [*SETTINGS_FIELDS, *EVALUATION_ALIASES, *VERL_ALIASES,
                          *_RLLIB_TRAINING_KEYS]))
        super().training(**{k: v for k, v in kwargs.items() if v is not NotProvided})
        for name, value in grpo_kwargs.items():
            if value is not NotProvided:
                setattr(self, name, value)
        return self

    @override(AlgorithmConfig)
    def update_from_dict(self, config_dict: dict) -> GRPOConfig:
        """RLlib's `update_from_dict`, also accepting verl's dotted names."""
        translated = {VERL_ALIASES.get(k, k): v for k, v in config_dict.items()}
        return super().update_from_dict(translated)

    def colocate(self, num_gpus: int) -> GRPOConfig:
        """verl's colocated layout on ``num_gpus`` GPUs: one learner per GPU and
        ``num_gpus / tensor_parallel_size`` env runners, each with a vLLM engine of that
        tensor parallel size on the learners' GPUs, asleep during the update
        (`layout.colocated_layout`).  Raises ValueError when the TP does not divide the GPUs."""
        from rllib_grpo.rllib.config.gpu_layout import colocated_layout, tensor_parallel_size

        layout = colocated_layout(num_gpus, tensor_parallel_size(self))
        settings = layout.settings()
        self.learners(num_learners=settings.pop("num_learners"),
                      num_gpus_per_learner=settings.pop("num_gpus_per_learner"))
        self.env_runners(**settings)
        return self

    # ---------------------------------------------------------------- RLlib plumbing
    @override(AlgorithmConfig)
    def get_default_learner_class(self) -> type:
        """`GRPOLearner`; its FSDP2 subclass when >= 2 learners shard the model (`fsdp`).

        LoRA runs keep RLlib's DDP: only the small adapter trains, and the adapter
        state/sync code reads unsharded weights.
        """
        return deserialize_type(self.learner_class_path(), error=True)

    def learner_class_path(self) -> str:
        """The import path of `get_default_learner_class` (the class not imported)."""
        if self.fsdp and self.num_learners >= 2 and not getattr(self, "lora_rank", 0):
            return FSDP_LEARNER
        return LEARNER

    @override(AlgorithmConfig)
    def build_learner_group(self, *, env=None, spaces=None, rl_module_spec=None,
                            placement_group=None):
        """RLlib's learner group, or `GRPOLearnerGroup` for remote GRPO learners: it shards
        by whole groups, gathers (FSDP) state on every learner, not learner 0 alone, and
        places the learners in the run's placement group (`RUN_PLACEMENT_GROUP`)."""
        if placement_group is None:
            placement_group = getattr(self, RUN_PLACEMENT_GROUP, None)
        if self.num_learners < 1 or not issubclass(self.learner_class,
                                                   deserialize_type(LEARNER, error=True)):
            return super().build_learner_group(env=env, spaces=spaces,
                                               rl_module_spec=rl_module_spec,
                                               placement_group=placement_group)
        if rl_module_spec is None:
            rl_module_spec = self.get_multi_rl_module_spec(env=env, spaces=spaces)
        return deserialize_type(LEARNER_GROUP, error=True)(config=self.copy(), module_spec=rl_module_spec,
                                placement_group=placement_group)

    @override(AlgorithmConfig)
    def get_default_rl_module_spec(self) -> RLModuleSpec:
        return RLModuleSpec(module_class=deserialize_type(RL_MODULE, error=True),
                            model_config=self.module_config())

    def module_config(self) -> dict[str, Any]:
        """What the causal-LM RLModule needs to build itself."""
        return {
            "model": self.model_path,
            "dtype": self.compute_dtype,  # compute dtype (and the reference's weights)
            "master_weights_dtype": self.master_weights_dtype,
            "sync_dtype": self.sampler_dtype,  # weights are cast to it for the samplers
            "gradient_checkpointing": self.checkpoints_activations,
            "temperature": self.temperature,
            "use_reference": self.needs_reference,
            "seed": self.seed,
            "config_overrides": dict(self.model_override_config),
            **{name: getattr(self, name) for name in MODULE_SETTINGS},  # LoRA, ref offload
            "token_stats": self.learner_token_stats,
        }

    @property
    def train_batch_size_per_learner(self) -> int:
        return self.batch_plan().trajectories_per_learner

    @train_batch_size_per_learner.setter
    def train_batch_size_per_learner(self, value: int | None) -> None:
        # RLlib's own __init__ assigns None; anything else would be silently overridden.
        if value is not None and value != self.batch_plan().trajectories_per_learner:
            raise ValueError(derived_field_error("train_batch_size_per_learner"))

    def placement_plan(self) -> PlacementPlan:
        """Where every process of a run of this config lives: its placement group's bundles
        and each process's seat in them (`layout.placement_plan`), reward workers and
        evaluation env runners included.  `GRPO.default_resource_request`, the run and
        `explain` all use it."""
        from rllib_grpo.rllib.config.gpu_layout import placement_plan
        from rllib_grpo.rllib.config.reward_plan import reward_worker_seats

        evaluation: list[tuple[float, float]] = []
        if self.evaluation_interval and self.evaluation_num_env_runners > 0:
            eval_config = self.get_evaluation_config_object()
            evaluation = [(float(eval_config.num_cpus_per_env_runner),
                           float(eval_config.num_gpus_per_env_runner or 0))
                          ] * self.evaluation_num_env_runners
        return placement_plan(self, reward_worker_seats(self), evaluation)

    def explain(self) -> str:
        """The resolved plan and every pitfall found, as text."""
        from rllib_grpo.rllib.config.explain import explain_config

        return explain_config(self)

    # ---------------------------------------------------------------- validation
    @override(AlgorithmConfig)
    def validate(self) -> None:
        """Raise `ValueError` naming the field and the fix for any inconsistent setting."""
        super().validate()
        from rllib_grpo.rllib.config.checks import find_errors

        errors = find_errors(self)
        if errors:
            self._value_error("Invalid GRPO config:\n  - " + "\n  - ".join(errors))
