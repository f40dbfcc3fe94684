"""Where the learners and the samplers' engines live on the GPUs, as a pure function of a
few numbers (no Ray, no GPU): verl's colocated layout and the one a config describes.

verl's layout (its ``trainer.n_gpus_per_node`` x ``trainer.nnodes`` GPUs, rollout tensor
parallel ``t``): every GPU holds one FSDP rank, and the N GPUs also hold N/t vLLM engines of
TP ``t``, which sleep (weights and KV cache released) during the update and wake before
sampling.  Here that is N learners and N/t remote env runners (one engine each) on the same
GPUs: each learner reserves `COLOCATED_LEARNER_GPU` of its GPU from Ray and each env runner
the rest, so one GPU holds exactly one learner and at most one env runner.

An engine of TP ``t > 1`` needs ``t`` GPUs, but Ray gives an env runner that reserves a
fraction of a GPU exactly one (its ``CUDA_VISIBLE_DEVICES``).  So each colocated TP engine
picks its GPUs itself (`colocated_engine_devices`): the env runner of worker index ``i``
drives the node's GPUs ``[(i-1) t, i t)``, which tiles the N GPUs with one engine shard
each, and sets ``CUDA_VISIBLE_DEVICES`` to them before vLLM starts its ``t`` worker
processes (vLLM's ``mp`` executor, as for TP on GPUs of its own).  The tiling is per node,
so these engines need all N GPUs on one node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Protocol

# vLLM's share of a GPU it shares with a learner while it samples (verl's default
# rollout.gpu_memory_utilization=0.5); during the update it sleeps and the learner has it.
COLOCATED_MEMORY_FRACTION = 0.5
# What a learner reserves from Ray of a GPU it shares with an engine: more than half, so
# that Ray never places two learners (two NCCL ranks) on one GPU; the env runner reserves
# the rest.  A scheduling token only: memory is split by gpu_memory_utilization.
COLOCATED_LEARNER_GPU = 0.75
COLOCATED_RUNNER_GPU = 1 - COLOCATED_LEARNER_GPU


class Placement(Protocol):
    """The fields of a GRPO config (`GRPOSettings` with RLlib's own) that place learners
    and engines; a protocol, so that settings.py can use this module without a cycle."""

    sampler: str
    sampler_config: dict[Any, Any]
    sampler_memory_fraction: float | None
    max_staleness: int
    num_learners: int
    num_gpus_per_learner: float
    num_env_runners: int
    num_gpus_per_env_runner: float


def explicit_local_env_runner(c: Placement) -> bool | None:
    """``create_local_env_runner`` as the user set it (None: unset, GRPO's default; see
    `rllib_grpo.rllib.config.grpo_config.LocalEnvRunnerWhereItSamples`)."""
    return vars(c).get("create_local_env_runner")


def local_env_runner_errors(c: Placement) -> list[str]:
    """No env runner at all: the driver's left out and no remote ones.  (RLlib validates
    an evaluation copy too, with the evaluation's runner count: not the one GRPO trains on.)"""
    if (c.num_env_runners == 0 and explicit_local_env_runner(c) is False
            and not getattr(c, "in_evaluation", False)):
        return ["create_local_env_runner=False with num_env_runners=0 leaves no env runner to "
                "sample: set num_env_runners >= 1, or leave create_local_env_runner unset (GRPO "
                "creates the driver's env runner only where no remote one samples)."]
    return []


def local_env_runner_pitfalls(c: Placement) -> list[str]:
    """An env runner in the driver beside remote ones: it never samples."""
    if c.num_env_runners > 0 and explicit_local_env_runner(c) is True:
        return [f"create_local_env_runner=True with num_env_runners={c.num_env_runners}: GRPO "
                "samples and validates on the remote env runners, so the driver's env runner "
                "only holds a sampler (a model copy or a vLLM engine) that every weight sync "
                "copies into; leave create_local_env_runner unset."]
    return []


@dataclasses.dataclass(frozen=True)
class Layout:
    """Learners and engines on GPUs.

    ``num_gpus``: GPUs the learners hold (the engines' too when ``colocated``);
    ``num_engines``: env runners, one vLLM engine each, of tensor parallel ``engine_tp``
    (0 engines: the local env runner samples in the driver);
    ``gpus_per_learner`` / ``gpus_per_env_runner``: what each reserves from Ray;
    ``sampler_memory_fraction``: the engine's share of each of its GPUs while it samples
    (vLLM's gpu_memory_utilization; None: vLLM's default).
    """

    num_gpus: int
    num_learners: int
    gpus_per_learner: float
    num_engines: int
    engine_tp: int
    gpus_per_env_runner: float
    colocated: bool
    sampler_memory_fraction: float | None

    def settings(self) -> dict[str, int | float | bool]:
        """The RLlib fields that give this layout (`GRPOConfig.colocate`, verl's keys)."""
        return {"num_learners": self.num_learners, "num_gpus_per_learner": self.gpus_per_learner,
                "num_env_runners": self.num_engines,
                "num_gpus_per_env_runner": self.gpus_per_env_runner,
                "create_local_env_runner": self.num_engines == 0}


def colocated_layout(num_gpus: int, tensor_parallel_size: int = 1,
                     sampler_memory_fraction: float | None = None) -> Layout:
    """verl's layout on ``num_gpus`` GPUs: one learner (FSDP rank) per GPU and
    ``num_gpus / tensor_parallel_size`` engines of that TP on the same GPUs, asleep during
    the update.  Raises ValueError when the TP does not divide the GPUs."""
    tp = max(1, int(tensor_parallel_size))
    if num_gpus < 1 or num_gpus % tp:
        raise ValueError(f"{num_gpus} GPUs cannot hold engines of tensor parallel {tp}: the "
                         "GPU count must be a positive multiple of the rollout TP size")
    return Layout(num_gpus=num_gpus, num_learners=num_gpus, gpus_per_learner=COLOCATED_LEARNER_GPU,
                  num_engines=num_gpus // tp, engine_tp=tp,
                  gpus_per_env_runner=COLOCATED_RUNNER_GPU, colocated=True,
                  sampler_memory_fraction=(COLOCATED_MEMORY_FRACTION if sampler_memory_fraction
                                           is None else sampler_memory_fraction))


def tensor_parallel_size(c: Placement) -> int:
    """The engines' tensor parallel size (``sampler_config``, verl's rollout TP)."""
    return int((c.sampler_config or {}).get("tensor_parallel_size", 1) or 1)


def shares_learner_gpus(c: Placement) -> bool:
    """The samplers share the learners' GPUs: the local env runner with the local learner
    on a GPU (one process), or remote env runners and learners that each reserve a part of
    a GPU leaving room for the other (`colocated_layout`'s shape)."""
    learner_gpu = c.num_gpus_per_learner or 0
    runner_gpu = c.num_gpus_per_env_runner or 0
    if c.num_env_runners == 0:
        return c.num_learners == 0 and learner_gpu > 0
    return c.num_learners >= 1 and 0 < learner_gpu < 1 and 0 < runner_gpu <= 1 - learner_gpu


def layout_of(c: Placement) -> Layout:
    """The layout a config describes."""
    colocated = shares_learner_gpus(c)
    gpus_per_learner = float(c.num_gpus_per_learner or 0)
    learners = max(1, c.num_learners)
    fraction = c.sampler_memory_fraction or (c.sampler_config or {}).get(
        "gpu_memory_utilization")
    if colocated and fraction is None:
        fraction = COLOCATED_MEMORY_FRACTION
    return Layout(num_gpus=learners if gpus_per_learner else 0, num_learners=c.num_learners,
                  gpus_per_learner=gpus_per_learner, num_engines=c.num_env_runners,
                  engine_tp=tensor_parallel_size(c),
                  gpus_per_env_runner=float(c.num_gpus_per_env_runner or 0), colocated=colocated,
                  sampler_memory_fraction=fraction)


def layout_errors(c: Placement) -> list[str]:
    """Layouts that cannot run: no env runner at all, two learners that could share a GPU,
    a TP engine with the wrong bundle, colocated engines that do not cover the learners'
    GPUs one rank each, or that cannot sleep."""
    return local_env_runner_errors(c) + _learner_gpu_errors(c) + _engine_errors(c)


def _learner_gpu_errors(c: Placement) -> list[str]:
    """Placements that NCCL refuses at the first collective, refused before Ray starts."""
    gpus = c.num_gpus_per_learner or 0
    # Two learners fit on one GPU only when each reserves at most half of it (above half,
    # as in verl's colocated layout, Ray gives every learner a GPU of its own).
    if c.num_learners >= 2 and 0 < gpus <= 0.5:
        return [f"num_gpus_per_learner={gpus} with num_learners={c.num_learners}: two learners "
                "could land on one GPU, which their NCCL group refuses ('Duplicate GPU "
                "detected', NVIDIA/nccl#1241); set num_gpus_per_learner=1 (one learner per GPU),"
                " or GRPOConfig.colocate(num_gpus) to share the GPUs with the engines."]
    return []


def _engine_errors(c: Placement) -> list[str]:
    tp, gpus = tensor_parallel_size(c), c.num_gpus_per_env_runner
    if c.sampler == "hf" or not gpus:
        return []
    if not shares_learner_gpus(c):
        if tp > 1 and gpus != tp:
            return [f"tensor_parallel_size={tp}: each env runner's vLLM engine spreads over "
                    f"{tp} GPUs, but num_gpus_per_env_runner={gpus}; set "
                    f"num_gpus_per_env_runner={tp} (a {tp}-GPU bundle per env runner), or "
                    "colocate the engines with the learners (GRPOConfig.colocate)."]
        return []
    errors = []
    if c.num_env_runners * tp != c.num_learners:
        errors.append(f"colocated engines: {c.num_env_runners} env runner(s) x "
                      f"tensor_parallel_size={tp} should cover the {c.num_learners} learners' "
                      f"GPUs one engine rank each; set num_env_runners="
                      f"{c.num_learners // tp if c.num_learners % tp == 0 else '?'} "
                      "(GRPOConfig.colocate(num_gpus) sets the layout).")
    if c.max_staleness:
        errors.append(f"colocated engines sleep during the update, but max_staleness="
                      f"{c.max_staleness} samples during it; set max_staleness=0 or give the "
                      "engines their own GPUs.")
    return errors


def engine_picks_devices(c: Placement) -> bool:
    """Whether each env runner's engine picks its GPUs itself (`colocated_engine_devices`):
    colocated vLLM engines of tensor parallel > 1 (Ray gives each env runner one GPU)."""
    return (c.sampler != "hf" and c.num_env_runners > 0 and tensor_parallel_size(c) > 1
            and shares_learner_gpus(c))


def colocated_engine_devices(node_gpus: Sequence[str], worker_index: int,
                             tensor_parallel: int) -> tuple[str, ...]:
    """The GPUs (ids as in ``CUDA_VISIBLE_DEVICES``) the colocated engine of env runner
    ``worker_index`` (1, 2, ...) drives: ``node_gpus[(i-1) t : i t]`` of its node's GPUs, so
    that the engines tile the learners' GPUs, one shard per GPU.  Raises ValueError, naming
    the fix, when the node has too few GPUs (the engines span several nodes)."""
    t, first = int(tensor_parallel), (int(worker_index) - 1) * int(tensor_parallel)
    if worker_index < 1:
        raise ValueError(f"colocated engines run in remote env runners (worker index >= 1), "
                         f"not in worker index {worker_index}.")
    if first + t > len(node_gpus):
        raise ValueError(
            f"colocated engine {worker_index} of tensor parallel {t} needs GPUs "
            f"{first}-{first + t - 1} of its node, which has {len(node_gpus)}: colocated "
            "engines of tensor parallel > 1 need all the learners' GPUs on one node; use one "
            "node, or tensor_parallel_size=1, or give the engines GPUs of their own "
            f"(num_gpus_per_env_runner={t}).")
    return tuple(str(gpu) for gpu in node_gpus[first:first + t])


def layout_lines(c: Placement) -> list[str]:
    """`explain`'s lines: where the learners and engines live, and each GPU's memory."""
    lay = layout_of(c)
    tp = f" of tensor parallel {lay.engine_tp}" if lay.engine_tp > 1 else ""
    learners = (f"{lay.num_learners} learner(s)" if lay.num_learners else "the local learner")
    where = f"{lay.num_gpus} GPU(s)" if lay.num_gpus else "CPU"
    if lay.num_engines == 0 and not lay.colocated:
        return [f"layout:                        {learners} on {where}; the local env runner "
                f"samples in the driver{tp}"]
    if not lay.colocated:
        return [f"layout:                        {learners} on {where}; {lay.num_engines} env "
                f"runner(s){tp} with {lay.gpus_per_env_runner:g} GPU each of their own"]
    engines = (f"{lay.num_engines} vLLM engine(s){tp}" if lay.num_engines
               else "the local env runner's vLLM engine")
    share = (f"{lay.sampler_memory_fraction:.0%}" if lay.sampler_memory_fraction
             else "vLLM's default share")
    return [
        f"layout:                        {learners} on {lay.num_gpus} GPU(s), one each; "
        f"{engines} colocated on the same GPUs (verl's layout), asleep during the update",
        f"memory per GPU:                sampling: the engine takes {share} (its weights' "
        f"shard + KV cache), the learner keeps what it holds in the rest; update: the engine "
        "sleeps (weights and KV cache released), the learner has the GPU",
    ]
