"""Where every process of a run lives, as a pure function of the config (no Ray, no GPU):
verl's colocated layout, separated layouts, and the placement plan that gives each process
a bundle of the run's Ray placement group.

verl's layout (its ``trainer.nnodes`` x ``trainer.n_gpus_per_node`` GPUs, rollout tensor
parallel ``t``): every GPU holds one FSDP rank, and the GPUs also hold GPUs / ``t`` vLLM
engines of TP ``t``, which sleep during the update and wake before sampling.  Here that is
one learner per GPU and GPUs / ``t`` remote env runners (one engine each) on the same GPUs;
a learner reserves `LEARNER_SHARE` of its GPU from Ray, an engine's share is the rest.

`placement_plan` turns a config into the run's placement group: one bundle per GPU (vLLM's
Ray executor takes bundles of at most one GPU) and one per process that holds no GPU, and a
`Seat` per process inside them: the main process, the learners, the env runners, the shards
of engines of TP > 1 (vLLM's Ray executor puts one worker in each bundle it is given), the
evaluation env runners and the reward workers.  Every process but the learners is created
with its bundle's index, so Ray's best fit never decides where a fractional GPU request
lands; the learners (Ray Train places them in "any bundle with room") find exactly one GPU
bundle with room each.  An engine's TP shards sit on GPUs of one node: `PlacementPlan.rebind`
tiles them within the nodes Ray put the bundles on.  `explain` and `rllib-grpo dry-run` print
the same plan the run places (`gpu_map_lines`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

# vLLM's share of a GPU it shares with a learner while it samples (verl's default
# rollout.gpu_memory_utilization=0.5); during the update it sleeps and the learner has it.
COLOCATED_MEMORY_FRACTION = 0.5
# Of a fractional GPU reserved from Ray, what vLLM may take (CUDA context and allocator slack).
FRACTIONAL_GPU_SAFETY = 0.9
# What a learner reserves from Ray of a GPU it shares with an engine: more than half, so
# that one GPU bundle never holds two learners (two NCCL ranks); the engine reserves the
# rest.  A scheduling token only: memory is split by gpu_memory_utilization.
LEARNER_SHARE = 0.75
ENGINE_SHARE = 1 - LEARNER_SHARE

# The roles of the processes a plan seats.
MAIN, LEARNER, ENV_RUNNER, ENGINE_SHARD, EVAL_RUNNER, REWARD_WORKER = (
    "main process", "learner", "env runner", "engine shard", "evaluation env runner",
    "reward worker")


class Placement(Protocol):
    """The fields of a GRPO config (`GRPOSettings` with RLlib's own) that place learners
    and engines; a protocol, so that settings.py can use this module without a cycle."""

    sampler: str
    sampler_config: dict[Any, Any]
    sampler_memory_fraction: float | None
    max_staleness: int
    gpus_per_node: int
    num_nodes: int
    num_learners: int
    num_gpus_per_learner: float
    num_cpus_per_learner: float | str
    num_env_runners: int
    num_gpus_per_env_runner: float
    num_cpus_per_env_runner: float
    num_cpus_for_main_process: float
    placement_strategy: str


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
    return Layout(num_gpus=num_gpus, num_learners=num_gpus, gpus_per_learner=LEARNER_SHARE,
                  num_engines=num_gpus // tp, engine_tp=tp, gpus_per_env_runner=ENGINE_SHARE,
                  colocated=True,
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
    a TP engine with the wrong GPUs, colocated engines that do not cover the learners' GPUs
    one rank each, or that cannot sleep, or TP groups that would cross nodes."""
    return local_env_runner_errors(c) + _learner_gpu_errors(c) + _engine_errors(c)


def _learner_gpu_errors(c: Placement) -> list[str]:
    """Placements that NCCL refuses at the first collective, refused before Ray starts."""
    gpus = c.num_gpus_per_learner or 0
    # Two learners fit on one GPU only when each reserves at most half of it (above half,
    # as in verl's colocated layout, every learner gets a GPU of its own).
    if c.num_learners >= 2 and 0 < gpus <= 0.5:
        return [f"num_gpus_per_learner={gpus} with num_learners={c.num_learners}: two learners "
                "could land on one GPU, which their NCCL group refuses ('Duplicate GPU "
                "detected', NVIDIA/nccl#1241); set num_gpus_per_learner=1 (one learner per GPU),"
                " or GRPOConfig.colocate(num_gpus) to share the GPUs with the engines."]
    if c.num_learners >= 2 and gpus > 1:
        return [f"num_gpus_per_learner={gpus}: a learner is one FSDP rank on one GPU; set "
                "num_gpus_per_learner=1 and num_learners to the GPU count."]
    return []


def _engine_errors(c: Placement) -> list[str]:
    tp, gpus = tensor_parallel_size(c), c.num_gpus_per_env_runner
    if c.sampler == "hf" or not gpus:
        return []
    if getattr(c, "in_evaluation", False) and c.num_env_runners == 0:
        return []  # an evaluation copy without runners of its own: GRPO validates on the run's
    if not shares_learner_gpus(c):
        if tp > 1 and gpus != tp:
            return [f"tensor_parallel_size={tp}: each env runner's vLLM engine spreads over "
                    f"{tp} GPUs, but num_gpus_per_env_runner={gpus}; set "
                    f"num_gpus_per_env_runner={tp} (one GPU per TP shard), or colocate the "
                    "engines with the learners (GRPOConfig.colocate)."]
        if tp == 1 and gpus > 1:
            return [f"num_gpus_per_env_runner={gpus} with tensor_parallel_size=1: the engine "
                    "uses one GPU; set num_gpus_per_env_runner=1, or tensor_parallel_size="
                    f"{int(gpus)} to spread it over {int(gpus)} GPUs."]
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
    per_node = int(getattr(c, "gpus_per_node", 0) or 0)
    if per_node and (per_node % tp or c.num_learners % per_node):
        errors.append(f"gpus_per_node={per_node} (verl trainer.n_gpus_per_node) with "
                      f"{c.num_learners} colocated GPUs and tensor_parallel_size={tp}: every node"
                      " must hold whole TP groups and the GPUs whole nodes; use a TP size that "
                      "divides the GPUs per node.")
    return errors


# ----------------------------------------------------------------------------- the plan
@dataclasses.dataclass(frozen=True)
class Bundle:
    """One bundle of the run's placement group: what Ray reserves for it.  A GPU bundle
    holds one GPU (or a learner's or a GPU engine's share of one) and knows which GPU of
    the planned cluster it stands for (``node``, ``gpu``: logical, as `explain` prints
    them; Ray decides the real node, `PlacementPlan.rebind`)."""

    cpus: float
    gpus: float = 0.0
    node: int | None = None
    gpu: int | None = None
    custom: tuple[tuple[str, float], ...] = ()

    def resources(self) -> dict[str, float]:
        """The bundle as Ray takes it (``{"CPU": ..., "GPU": ...}``, no zero amounts)."""
        resources = {"CPU": float(self.cpus)} if self.cpus else {}
        if self.gpus:
            resources["GPU"] = float(self.gpus)
        resources.update(self.custom)
        return resources


@dataclasses.dataclass(frozen=True)
class Seat:
    """One process's reservation inside a bundle: its role and index (learner rank, env
    runner worker index, TP shard rank, reward worker index), the bundle, what it reserves
    there, and for an engine shard the env runner whose engine it belongs to."""

    role: str
    index: int
    bundle: int
    cpus: float
    gpus: float
    engine: int | None = None
    label: str = ""
    custom: tuple[tuple[str, float], ...] = ()

    @property
    def name(self) -> str:
        return self.label or (f"engine {self.engine} shard {self.index}"
                              if self.role == ENGINE_SHARD else f"{self.role} {self.index}")


@dataclasses.dataclass(frozen=True)
class PlacementPlan:
    """Every process of a run in a bundle of one placement group (module docstring)."""

    bundles: tuple[Bundle, ...]
    seats: tuple[Seat, ...]
    strategy: str
    engine_tp: int
    colocated: bool
    gpus_per_node: int

    @classmethod
    def of_bundles(cls, specs: Iterable[dict[str, float]], strategy: str = "PACK",
                   ) -> PlacementPlan:
        """A plan of plain bundles (another algorithm's resource request), one process each."""
        bundles = tuple(Bundle(cpus=spec.get("CPU", 0.0), gpus=spec.get("GPU", 0.0),
                               custom=tuple((k, v) for k, v in spec.items()
                                            if k not in ("CPU", "GPU")))
                        for spec in specs)
        seats = tuple(Seat(f"process in bundle {i}", i, i, b.cpus, b.gpus, label=f"bundle {i}")
                      for i, b in enumerate(bundles))
        return cls(bundles, seats, strategy, engine_tp=1, colocated=False, gpus_per_node=0)

    @property
    def uses_gpus(self) -> bool:
        return any(bundle.gpus for bundle in self.bundles)

    def bundle_specs(self) -> list[dict[str, float]]:
        """The placement group's bundles, as `ray.util.placement_group` and Tune take them."""
        return [bundle.resources() for bundle in self.bundles]

    def required_resources(self) -> dict[str, float]:
        """The whole plan's resources (Tune's ``required_resources``)."""
        total: dict[str, float] = {}
        for spec in self.bundle_specs():
            for key, value in spec.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def seats_of(self, role: str) -> list[Seat]:
        return [seat for seat in self.seats if seat.role == role]

    def seat(self, role: str, index: int) -> Seat:
        for seat in self.seats:
            if seat.role == role and seat.index == index:
                return seat
        raise KeyError(f"the placement plan has no {role} {index}")

    def engine_shards(self, worker_index: int) -> list[Seat]:
        """The TP shards of env runner ``worker_index``'s engine, by shard rank (empty for
        an engine of TP 1, which runs in the env runner's own process)."""
        return sorted((s for s in self.seats if s.role == ENGINE_SHARD
                       and s.engine == worker_index), key=lambda s: s.index)

    def rebind(self, bundle_nodes: Sequence[str]) -> PlacementPlan:
        """This plan on the nodes Ray placed its bundles on (``bundle_nodes[i]``: bundle
        ``i``'s node): the engines' TP groups tiled over their GPU bundles node by node, so
        that no engine spans two nodes.  Raises ValueError, naming the node, when a node
        holds a number of an engine pool's GPU bundles that TP groups cannot tile."""
        if self.engine_tp <= 1:
            return self
        shards = [s for s in self.seats if s.role == ENGINE_SHARD]
        pool = sorted({s.bundle for s in shards})
        by_node: dict[str, list[int]] = {}
        for bundle in pool:
            by_node.setdefault(bundle_nodes[bundle], []).append(bundle)
        tiled: list[int] = []
        for node, bundles in by_node.items():
            if len(bundles) % self.engine_tp:
                raise ValueError(
                    f"Ray placed {len(bundles)} of the engines' GPU bundles on node {node}, "
                    f"which engines of tensor parallel {self.engine_tp} cannot tile (a TP "
                    "group never spans two nodes); give each node a multiple of "
                    f"{self.engine_tp} GPUs for the run, or lower tensor_parallel_size.")
            tiled += bundles
        engines = sorted({s.engine for s in shards if s.engine is not None})
        where = {(engine, rank): tiled[k * self.engine_tp + rank]
                 for k, engine in enumerate(engines) for rank in range(self.engine_tp)}
        seats = tuple(dataclasses.replace(s, bundle=where[(s.engine or 0, s.index)])
                      if s.role == ENGINE_SHARD else s for s in self.seats)
        return dataclasses.replace(self, seats=seats)


def _learner_cpus(c: Placement) -> float:
    """RLlib's ``num_cpus_per_learner="auto"``: 1 on a CPU learner, 0 beside a GPU."""
    if c.num_cpus_per_learner != "auto":
        return float(c.num_cpus_per_learner)
    return 0.0 if (c.num_gpus_per_learner or 0) > 0 else 1.0


def _custom(resources: dict[str, float] | None) -> tuple[tuple[str, float], ...]:
    return tuple(sorted((resources or {}).items()))


class _Builder:
    """Bundles and seats in order (the plan's construction)."""

    def __init__(self) -> None:
        self.bundles: list[Bundle] = []
        self.seats: list[Seat] = []

    def bundle(self, bundle: Bundle) -> int:
        self.bundles.append(bundle)
        return len(self.bundles) - 1

    def seat(self, role: str, index: int, bundle: int, cpus: float, gpus: float, **kw: Any,
             ) -> None:
        self.seats.append(Seat(role, index, bundle, float(cpus), float(gpus), **kw))


def placement_plan(c: Placement, reward_workers: Sequence[tuple[str, float]] = (),
                   evaluation_runners: Sequence[tuple[float, float]] = ()) -> PlacementPlan:
    """The run's placement plan (module docstring).

    ``reward_workers``: ``(label, GPUs)`` of each reward actor
    (`rllib_grpo.rllib.config.reward_plan.reward_worker_seats`); ``evaluation_runners``:
    ``(CPUs, GPUs)`` of each evaluation env runner of its own (RLlib's evaluation config).
    Bundle 0 is the main process (the driver or Tune's trial actor: the local learner and
    the local env runner live there).  Then, colocated: one bundle per GPU, node by node;
    else the env runners', the learners', the evaluation runners' and the reward workers'.
    """
    tp = tensor_parallel_size(c)
    colocated = shares_learner_gpus(c) and c.num_env_runners > 0
    per_node = int(getattr(c, "gpus_per_node", 0) or 0)
    learner_cpus, learner_gpus = _learner_cpus(c), float(c.num_gpus_per_learner or 0)
    runner_cpus, runner_gpus = float(c.num_cpus_per_env_runner), float(
        c.num_gpus_per_env_runner or 0)
    runner_custom = _custom(getattr(c, "custom_resources_per_env_runner", None))
    learner_custom = _custom(getattr(c, "custom_resources_per_learner", None))
    plan = _Builder()
    local_learner = c.num_learners == 0
    main = plan.bundle(Bundle(
        cpus=max(learner_cpus, c.num_cpus_for_main_process) if local_learner
        else c.num_cpus_for_main_process, gpus=learner_gpus if local_learner else 0.0,
        custom=_custom(getattr(c, "custom_resources_for_main_process", None))))
    plan.seat(MAIN, 0, main, plan.bundles[main].cpus, plan.bundles[main].gpus)

    def logical(g: int) -> tuple[int, int]:
        return (g // per_node, g % per_node) if per_node else (0, g)

    if colocated:
        # An engine of TP 1 is its env runner, seated on its GPU; the env runner of a TP
        # engine holds no GPU and sits in a bundle of its own, its shards on the GPUs.
        gpu_bundles = []
        for g in range(c.num_learners):
            runner_here = tp == 1 and g < c.num_env_runners
            gpu_bundles.append(plan.bundle(Bundle(
                cpus=learner_cpus + (runner_cpus if runner_here else 0.0), gpus=1.0,
                node=logical(g)[0], gpu=logical(g)[1])))
        for rank, bundle in enumerate(gpu_bundles):
            plan.seat(LEARNER, rank, bundle, learner_cpus, learner_gpus, custom=learner_custom)
        for k in range(1, c.num_env_runners + 1):
            if tp == 1:
                plan.seat(ENV_RUNNER, k, gpu_bundles[k - 1], runner_cpus, runner_gpus,
                          custom=runner_custom)
                continue
            bundle = plan.bundle(Bundle(cpus=runner_cpus, custom=runner_custom))
            plan.seat(ENV_RUNNER, k, bundle, runner_cpus, 0.0, custom=runner_custom)
            for rank in range(tp):
                g = (k - 1) * tp + rank
                plan.seat(ENGINE_SHARD, rank, gpu_bundles[g], 0.0, runner_gpus, engine=k)
    else:
        g = 0  # logical GPUs, in bundle order
        for k in range(1, c.num_env_runners + 1):
            if tp > 1 and runner_gpus:
                bundle = plan.bundle(Bundle(cpus=runner_cpus, custom=runner_custom))
                plan.seat(ENV_RUNNER, k, bundle, runner_cpus, 0.0, custom=runner_custom)
                for rank in range(tp):
                    shard = plan.bundle(Bundle(cpus=0.0, gpus=1.0, node=logical(g)[0],
                                               gpu=logical(g)[1]))
                    plan.seat(ENGINE_SHARD, rank, shard, 0.0, 1.0, engine=k)
                    g += 1
                continue
            node, gpu = logical(g) if runner_gpus else (None, None)
            bundle = plan.bundle(Bundle(cpus=runner_cpus, gpus=runner_gpus, node=node, gpu=gpu,
                                        custom=runner_custom))
            plan.seat(ENV_RUNNER, k, bundle, runner_cpus, runner_gpus, custom=runner_custom)
            g += 1 if runner_gpus else 0
        for rank in range(c.num_learners):
            node, gpu = logical(g) if learner_gpus else (None, None)
            bundle = plan.bundle(Bundle(cpus=learner_cpus, gpus=learner_gpus, node=node, gpu=gpu,
                                        custom=learner_custom))
            plan.seat(LEARNER, rank, bundle, learner_cpus, learner_gpus, custom=learner_custom)
            g += 1 if learner_gpus else 0
    for k, (cpus, gpus) in enumerate(evaluation_runners, start=1):
        bundle = plan.bundle(Bundle(cpus=cpus, gpus=gpus))
        plan.seat(EVAL_RUNNER, k, bundle, cpus, gpus)
    for i, (label, gpus) in enumerate(reward_workers):
        bundle = plan.bundle(Bundle(cpus=1.0, gpus=gpus))
        plan.seat(REWARD_WORKER, i, bundle, 1.0, gpus, label=label)
    return PlacementPlan(bundles=tuple(plan.bundles), seats=tuple(plan.seats),
                         strategy=c.placement_strategy, engine_tp=tp, colocated=colocated,
                         gpus_per_node=per_node)


# ----------------------------------------------------------------------------- fitting
def unplaceable(plan: PlacementPlan, nodes: Sequence[dict[str, float]]) -> str | None:
    """Why ``plan``'s placement group cannot be placed on a cluster of ``nodes`` (each
    node's free resources, e.g. ``{"CPU": 8, "GPU": 8}``), or None when it fits: the first
    bundle that finds no node with room once the larger ones took theirs (first fit,
    largest first, as a packing placement group fills nodes), with what sits in it.
    ``STRICT_PACK`` needs every bundle on one node."""
    if plan.strategy == "STRICT_PACK":
        need = plan.required_resources()
        if any(_fits(need, node) for node in nodes):
            return None
        return (f"the run ({_amounts(need)}) must fit on one node (placement_strategy="
                f"STRICT_PACK), but the largest node has {_amounts(max(nodes, key=len, default={}))}")
    free = [dict(node) for node in nodes]
    order = sorted(range(len(plan.bundles)), key=lambda i: (
        -plan.bundles[i].gpus, -plan.bundles[i].cpus, i))
    for i in order:
        need = plan.bundles[i].resources()
        node = next((node for node in free if _fits(need, node)), None)
        if node is None:
            who = ", ".join(s.name for s in plan.seats if s.bundle == i) or "a bundle"
            left = "; ".join(", ".join(f"{n.get(k, 0.0):g} {k}" for k in need
                                       if n.get(k, 0.0) != float("inf")) or "room"
                             for n in free)
            return (f"{who} needs {_amounts(need)} on one node, but once the run's larger "
                    f"bundles are placed the cluster's nodes have left: {left}")
        for key, value in need.items():
            node[key] = node.get(key, 0.0) - value
    return None


def _amounts(resources: dict[str, float]) -> str:
    return ", ".join(f"{value:g} {key}" for key, value in sorted(resources.items()) if value)


def _fits(need: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(key, 0.0) + 1e-9 >= value for key, value in need.items() if value)


# ----------------------------------------------------------------------------- the map
def gpu_of(plan: PlacementPlan, bundle: int) -> tuple[int, int] | None:
    """The logical ``(node, GPU)`` of a GPU bundle, None for a bundle without a GPU."""
    b = plan.bundles[bundle]
    if not b.gpus or b.gpu is None:
        return None
    return (b.node or 0, b.gpu)


def gpu_rows(plan: PlacementPlan) -> list[tuple[int, int, str, str, str]]:
    """One row per GPU of the plan: ``(node, GPU, learner, engine, other)`` (text; "-"
    where nothing of that kind sits), node by node."""
    rows = []
    for i in range(len(plan.bundles)):
        where = gpu_of(plan, i)
        if where is None:
            continue
        seats = [s for s in plan.seats if s.bundle == i]
        learner = ", ".join(f"rank {s.index}" for s in seats if s.role == LEARNER) or "-"
        engine = ", ".join(
            f"engine {s.engine} shard {s.index}" if s.role == ENGINE_SHARD
            else f"engine {s.index} (env runner {s.index})"
            for s in seats if s.role in (ENGINE_SHARD, ENV_RUNNER) and s.gpus) or "-"
        other = ", ".join(s.name for s in seats
                          if s.role in (MAIN, REWARD_WORKER, EVAL_RUNNER) and s.gpus) or "-"
        rows.append((*where, learner, engine, other))
    return sorted(rows)


def gpu_map_lines(plan: PlacementPlan, transports: dict[int, str] | None = None) -> list[str]:
    """The plan as a table, one row per GPU (``explain``; ``rllib-grpo dry-run`` prints the
    same table of where the processes landed), then the processes that hold no GPU and,
    with ``transports`` (env runner -> transport), how each env runner's weights travel."""
    off_gpu = [_cpu_label(s) for s in plan.seats if not s.gpus and s.role != MAIN]
    return map_table_lines(gpu_rows(plan), off_gpu, transports)


def map_table_lines(rows: Sequence[tuple[int, int, str, str, str]], off_gpu: Sequence[str],
                    transports: dict[int, str] | None) -> list[str]:
    """``(node, GPU, learner, engine, other)`` rows as a table, the processes without a GPU
    and each env runner's weight transport."""
    lines = []
    if rows:
        lines.append(f"{'node':>6} {'GPU':>4}  {'learner':<10} {'engine / TP shard':<28} other")
        lines += [f"{node:>6} {gpu:>4}  {learner:<10} {engine:<28} {other}"
                  for node, gpu, learner, engine, other in rows]
    if off_gpu:
        lines.append("without a GPU: " + ", ".join(off_gpu))
    if transports:
        lines.append("weight sync: " + ", ".join(
            f"env runner {k} <- {t}" if k else f"the local env runner <- {t}"
            for k, t in sorted(transports.items())))
    return lines


def _cpu_label(seat: Seat) -> str:
    return f"{seat.name} ({seat.cpus:g} CPU)"


def layout_lines(c: Placement, plan: PlacementPlan,
                 transports: dict[int, str] | None = None) -> list[str]:
    """`explain`'s lines: where the learners and engines live, each GPU's memory while
    sampling and training, and the plan's map of the GPUs (`gpu_map_lines`)."""
    lay = layout_of(c)
    tp = f" of tensor parallel {lay.engine_tp}" if lay.engine_tp > 1 else ""
    learners = (f"{lay.num_learners} learner(s)" if lay.num_learners else "the local learner")
    where = f"{lay.num_gpus} GPU(s)" if lay.num_gpus else "CPU"
    if lay.num_engines == 0 and not lay.colocated:
        lines = [f"layout:                        {learners} on {where}; the local env runner "
                 f"samples in the driver{tp}"]
    elif not lay.colocated:
        lines = [f"layout:                        {learners} on {where}; {lay.num_engines} env "
                 f"runner(s){tp} with {lay.gpus_per_env_runner:g} GPU each of their own"]
    else:
        engines = (f"{lay.num_engines} vLLM engine(s){tp}" if lay.num_engines
                   else "the local env runner's vLLM engine")
        share = (f"{lay.sampler_memory_fraction:.0%}" if lay.sampler_memory_fraction
                 else "vLLM's default share")
        lines = [
            f"layout:                        {learners} on {lay.num_gpus} GPU(s), one each; "
            f"{engines} colocated on the same GPUs (verl's layout), asleep during the update",
            f"memory per GPU:                sampling: the engine takes {share} (its weights' "
            "shard + KV cache), the learner keeps what it holds in the rest; update: the "
            "engine sleeps (weights and KV cache released), the learner has the GPU",
        ]
    nodes = {b.node for b in plan.bundles if b.gpus and b.node is not None}
    if plan.uses_gpus:
        lines.append(f"placement:                     one placement group of {len(plan.bundles)} "
                     f"bundle(s) ({plan.strategy}), {sum(1 for _ in gpu_rows(plan))} GPU(s)"
                     + (f" on {len(nodes)} node(s) of {plan.gpus_per_node}"
                        if plan.gpus_per_node else "") + ":")
        lines += ["  " + line for line in gpu_map_lines(plan, transports)]
    return lines


def planned_transports(c: Placement, plan: PlacementPlan) -> dict[int, str]:
    """The weight transport of each env runner (0: the driver's) as the run's planner
    (`rllib_grpo.weights.plan.choose_transports`) picks it for the plan's places: every
    learner's GPU on the sending side, each env runner's engine (its shards' GPUs) a
    receiver.  A refused setting or placement raises ValueError, as in a run."""
    from rllib_grpo.weights.plan import Endpoint, choose_transports

    def node_of(seat: Seat) -> str:
        return f"node {plan.bundles[seat.bundle].node or 0}"

    def gpu_ids(seats: list[Seat]) -> tuple[str, ...]:
        return tuple(f"node {where[0]} GPU {where[1]}" for seat in seats if seat.gpus
                     for where in [gpu_of(plan, seat.bundle)] if where)

    learners = plan.seats_of(LEARNER) or plan.seats_of(MAIN)
    learner_gpus = gpu_ids(learners)
    sender = Endpoint(node_of(learners[0]), pid=hash(learners[0].name),
                      device="cuda" if learner_gpus else "cpu", gpus=learner_gpus,
                      host_payload=getattr(c, "lora_rank", 0) > 0)
    receivers: dict[int, Endpoint] = {}
    for seat in plan.seats_of(ENV_RUNNER) or plan.seats_of(MAIN):
        if seat.role == MAIN:  # the driver's env runner, in the driver's process
            in_learner = learners[0].role == MAIN
            receivers[0] = dataclasses.replace(sender, in_driver=True) if in_learner else \
                Endpoint(node_of(seat), pid=hash(seat.name), in_driver=True)
            continue
        shards = plan.engine_shards(seat.index) or [seat]
        gpus = gpu_ids(shards)
        receivers[seat.index] = Endpoint(
            node_of(shards[0]), pid=hash(seat.name), device="cuda" if gpus else "cpu",
            gpus=gpus, vllm_gpu=bool(gpus) and c.sampler != "hf")
    return choose_transports(getattr(c, "weight_sync_transport", "auto"), sender, receivers)
