"""``rllib-grpo dry-run``: a run's GPU layout placed on a local Ray cluster that only declares
its GPUs, before anyone pays for the real one.

    rllib-grpo dry-run trainer.nnodes=2 trainer.n_gpus_per_node=8 \\
        actor_rollout_ref.rollout.tensor_model_parallel_size=2 ...  --nodes 2 --gpus-per-node 8

It starts a local cluster of that shape (`ray.cluster_utils.Cluster`, GPUs declared, the
package's fake-GPU switch on: `rllib_grpo.rllib.placement.fake_gpus`), reserves the run's
placement group with the same code a run uses (`RunPlacement`), puts a light stand-in in
every seat (Ray options and creation order as the run's: reward workers, env runners with
their engines' TP workers, learners placed by Ray as Ray Train places them), asks each
where it landed, checks the layout (`check_places`) and prints one row per GPU, then the
memory plan of every GPU (`rllib_grpo.rllib.config.memory`; ``--gpu-memory``).  Where the
machine can hold it (``--step``), it then builds the real algorithm on the same cluster with
a tiny model of the configured architecture and runs one training step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from rllib_grpo.cli.experiment import ConfigError
from rllib_grpo.logs import quiet_console

if TYPE_CHECKING:
    from rllib_grpo.rllib.algorithm.placement_group import RunPlacement
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

# What one simulated node offers besides its GPUs (stand-ins take no real CPU).
DEFAULT_CPUS_PER_NODE = 16
# A real step runs where the run has at most this many GPU processes (2 cores here).
MAX_PROCESSES_FOR_A_STEP = 6


@dataclasses.dataclass(frozen=True)
class Placed:
    """One process of the run where it landed: its seat's name and role, its Ray node
    (numbered in the order the cluster's nodes appear), the GPU ids Ray assigned it and
    the ``CUDA_VISIBLE_DEVICES`` it runs with."""

    name: str
    role: str
    node: int
    gpu_ids: tuple[str, ...]
    cuda_visible_devices: str | None
    engine: int | None = None


@contextlib.contextmanager
def fake_gpu_cluster(nodes: int, gpus_per_node: int,
                     cpus_per_node: int = DEFAULT_CPUS_PER_NODE) -> Iterator[Any]:
    """A local Ray cluster of ``nodes`` nodes declaring ``gpus_per_node`` GPUs each, with
    the fake-GPU switch on in every process it starts; connected for the block."""
    import ray
    from ray.cluster_utils import Cluster

    from rllib_grpo.rllib.placement import FAKE_GPUS_VARIABLE

    if ray.is_initialized():
        raise ConfigError("dry-run starts a Ray cluster of its own: run it without Ray up")
    previous = os.environ.get(FAKE_GPUS_VARIABLE)
    os.environ[FAKE_GPUS_VARIABLE] = "1"
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": cpus_per_node, "num_gpus": gpus_per_node,
        "object_store_memory": 200 * 2**20, "include_dashboard": False})
    try:
        for _ in range(nodes - 1):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node,
                             object_store_memory=200 * 2**20)
        ray.init(address=cluster.address, log_to_driver=False, configure_logging=False)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        if previous is None:
            os.environ.pop(FAKE_GPUS_VARIABLE, None)
        else:
            os.environ[FAKE_GPUS_VARIABLE] = previous


class StandIn:
    """A process of the run that only reports where it landed; an env runner's stand-in
    also holds its engine's TP workers, as the env runner does."""

    def __init__(self, startup_timeout_s: float = 60.0) -> None:
        from rllib_grpo.rllib.placement import hide_unassigned_gpus, hold_engine_shards

        hide_unassigned_gpus()
        self.shards = hold_engine_shards(startup_timeout_s)

    def report(self) -> dict[str, Any]:
        import ray

        from rllib_grpo.rllib.placement import whereabouts

        return {"self": whereabouts(),
                "shards": ray.get([s.whereabouts.remote() for s in self.shards])}


def place_stand_ins(config: GRPOConfig, timeout_s: float = 120.0,
                    learners_first: bool = False) -> tuple[RunPlacement, list[Placed]]:
    """Reserve ``config``'s placement group on the connected cluster and seat a stand-in
    in every seat, in the run's order (``learners_first``: the learners before the rest,
    which a colocated layout does not mind); each process as it landed, nodes numbered as
    ``ray.nodes()``."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rllib_grpo.rllib.algorithm.placement_group import RunPlacement, wait_started
    from rllib_grpo.rllib.config.gpu_layout import ENGINE_SHARD, ENV_RUNNER, LEARNER, MAIN

    placement = RunPlacement.start(config, timeout_s)
    if placement is None:
        return _cpu_only(config), []
    remote = ray.remote(StandIn)
    seats = [s for s in placement.plan.seats if s.role not in (MAIN, ENGINE_SHARD)]
    # RLlib's order: the env runners (with their engines' workers) and the reward workers
    # are up before the learners are created; colocated, the order does not matter.
    waves = [[s for s in seats if s.role != LEARNER], [s for s in seats if s.role == LEARNER]]
    if learners_first:
        waves.reverse()
    reports_by_seat: dict[str, dict[str, Any]] = {}
    actors = []
    for wave in waves:
        started = []
        for seat in wave:
            if seat.role == LEARNER:  # as Ray Train places its workers: any bundle with room
                options = {"num_cpus": seat.cpus, "num_gpus": seat.gpus,
                           "scheduling_strategy": PlacementGroupSchedulingStrategy(
                               placement.group)}
            else:
                environment = placement.engine_environment(seat.index) \
                    if seat.role == ENV_RUNNER else {}
                options = placement.options(seat, environment)
            started.append(remote.options(**options).remote(timeout_s))
        reports = wait_started([a.report.remote() for a in started], "stand-ins", timeout_s)
        reports_by_seat.update({seat.name: report for seat, report in zip(wave, reports,
                                                                          strict=True)})
        actors += started
    nodes = {node["NodeID"]: i for i, node in enumerate(ray.nodes())}
    placed: list[Placed] = []
    learner_places = []
    for seat in seats:
        report = reports_by_seat[seat.name]
        where = _placed(seat.name, seat.role, report["self"], nodes,
                        engine=seat.index if seat.role == ENV_RUNNER else None)
        if seat.role == LEARNER:
            learner_places.append(where)
            continue
        placed.append(where)
        placed += [_placed(f"engine {seat.index} shard {rank}", ENGINE_SHARD, shard, nodes,
                           engine=seat.index)
                   for rank, shard in enumerate(report["shards"])]
    # Ray Train ranks its workers by node and GPU id.
    learner_places.sort(key=lambda p: (p.node, [int(g) for g in p.gpu_ids]))
    placed += [dataclasses.replace(p, name=f"learner {rank}")
               for rank, p in enumerate(learner_places)]
    for actor in actors:
        ray.kill(actor)
    return placement, placed


def _cpu_only(config: GRPOConfig) -> Any:
    raise ConfigError("this configuration uses no GPU: there is nothing to place (the run "
                      "schedules its CPU processes with Ray's defaults)")


def _placed(name: str, role: str, where: dict[str, Any], nodes: dict[str, int],
            engine: int | None = None) -> Placed:
    return Placed(name, role, nodes.get(where["node_id"], -1), tuple(where["gpu_ids"]),
                  where["cuda_visible_devices"], engine)


def check_places(config: GRPOConfig, placed: list[Placed]) -> list[str]:
    """What is wrong with where the processes landed (empty: the layout holds): a process
    with another GPU count than its seat, a 0-GPU process that sees GPUs, two learners or
    two engines on one GPU, an engine whose TP shards span nodes, a colocated GPU without
    its learner and engine, a weight transport other than the plan's."""
    from rllib_grpo.rllib.config.gpu_layout import ENGINE_SHARD, LEARNER, planned_transports
    from rllib_grpo.weights.plan import transports_summary

    plan = config.placement_plan()
    problems = []
    planned = {s.name: s for s in plan.seats}
    per_gpu: dict[tuple[int, str], list[Placed]] = {}
    for p in placed:
        seat = planned.get(p.name) or next((s for s in plan.seats if s.role == p.role), None)
        wants = 1 if seat is not None and seat.gpus else 0
        if len(p.gpu_ids) != wants:
            problems.append(f"{p.name} holds GPUs {list(p.gpu_ids)}, planned {wants}")
        if not p.gpu_ids and p.cuda_visible_devices not in ("", None):
            problems.append(f"{p.name} holds no GPU but sees CUDA_VISIBLE_DEVICES="
                            f"{p.cuda_visible_devices}")
        for gpu in p.gpu_ids:
            per_gpu.setdefault((p.node, gpu), []).append(p)
    for (node, gpu), here in sorted(per_gpu.items()):
        learners = [p.name for p in here if p.role == LEARNER]
        engines = {p.engine for p in here if p.engine is not None}
        if len(learners) > 1:
            problems.append(f"node {node} GPU {gpu} holds {', '.join(learners)}")
        if len(engines) > 1:
            problems.append(f"node {node} GPU {gpu} holds engines {sorted(engines)}")
        if plan.colocated and (len(learners) != 1 or len(engines) != 1):
            problems.append(f"node {node} GPU {gpu} holds {learners or 'no learner'} and "
                            f"engines {sorted(engines) or 'none'}: colocated, it should hold "
                            "one of each")
    shard_nodes: dict[int, set[int]] = {}
    for p in placed:
        if p.role == ENGINE_SHARD and p.engine is not None:
            shard_nodes.setdefault(p.engine, set()).add(p.node)
    problems += [f"engine {engine}'s TP shards span nodes {sorted(nodes)}"
                 for engine, nodes in sorted(shard_nodes.items()) if len(nodes) > 1]
    in_plan, as_placed = planned_transports(config, plan), placed_transports(config, placed)
    if as_placed != in_plan:
        problems.append(f"where the processes landed the weight sync would take "
                        f"{transports_summary(as_placed)}; the plan says "
                        f"{transports_summary(in_plan)}")
    return problems


def placed_transports(config: GRPOConfig, placed: list[Placed]) -> dict[int, str]:
    """Each env runner's weight transport as the run's planner picks it from where the
    processes landed (the GPUs Ray assigned them, as the run's endpoints name fake GPUs)."""
    from rllib_grpo.rllib.config.gpu_layout import ENGINE_SHARD, ENV_RUNNER, LEARNER
    from rllib_grpo.weights.plan import Endpoint, choose_transports

    def gpus(processes: list[Placed]) -> tuple[str, ...]:
        return tuple(f"{p.node}:{g}" for p in processes for g in p.gpu_ids)

    learners = sorted((p for p in placed if p.role == LEARNER),
                      key=lambda p: int(p.name.split()[-1]))
    learner_gpus = gpus(learners)
    sender = Endpoint(str(learners[0].node if learners else 0), -1,
                      "cuda" if learner_gpus else "cpu", learner_gpus,
                      host_payload=config.lora_rank > 0)
    receivers = {}
    for runner in placed:
        index = runner.engine
        if runner.role != ENV_RUNNER or index is None:
            continue
        shards = [p for p in placed if p.role == ENGINE_SHARD and p.engine == index]
        on = gpus(shards or [runner])
        receivers[index] = Endpoint(str((shards or [runner])[0].node), index,
                                    "cuda" if on else "cpu", on,
                                    vllm_gpu=bool(on) and config.sampler != "hf")
    return choose_transports(config.weight_sync_transport, sender, receivers)


def placed_map_lines(placed: list[Placed], transports: dict[int, str] | None) -> list[str]:
    """One row per GPU the processes landed on: node, GPU id, learner, engine/TP shard,
    other; then the processes without a GPU and each env runner's weight transport."""
    from rllib_grpo.rllib.config.gpu_layout import (
        ENGINE_SHARD,
        ENV_RUNNER,
        LEARNER,
        map_table_lines,
    )

    rows: dict[tuple[int, int], dict[str, list[str]]] = {}
    for p in placed:
        for gpu_id in p.gpu_ids:
            row = rows.setdefault((p.node, int(gpu_id)),
                                  {"learner": [], "engine": [], "other": []})
            if p.role == LEARNER:
                row["learner"].append("rank " + p.name.split()[-1])
            elif p.role in (ENGINE_SHARD, ENV_RUNNER):
                row["engine"].append(p.name if p.role == ENGINE_SHARD
                                     else f"engine {p.engine} ({p.name})")
            else:
                row["other"].append(p.name)
    table = [(node, gpu, ", ".join(row["learner"]) or "-", ", ".join(row["engine"]) or "-",
              ", ".join(row["other"]) or "-") for (node, gpu), row in sorted(rows.items())]
    return map_table_lines(table, [p.name for p in placed if not p.gpu_ids], transports)


def tiny_step_config(config: GRPOConfig) -> GRPOConfig:
    """``config`` shrunk to a step this machine runs: a tiny random model of the configured
    architecture, the arithmetic task, a few short prompts; the layout and the algorithm's
    knobs kept."""
    from rllib_grpo.models.model_registry import architecture_of, resolve_model

    learners = max(1, config.num_learners)
    prompts = learners * max(1, config.num_env_runners)
    small = config.copy(copy_frozen=False)
    small.environment("rllib_grpo/Arithmetic-v0", env_config={"max_operand": 4})
    tiny = resolve_model("builtin:tiny",
                         builder_kwargs={"arch": architecture_of(config.model_path)})
    small.training(model_path=tiny, model_override_config={},
                   prompts_per_step=prompts, prompts_per_minibatch=prompts, group_size=2,
                   gen_prompts_per_batch=None, max_prompt_length=16, max_response_length=4,
                   use_dynamic_bsz=False, micro_batch_size_per_learner=None,
                   val_before_train=False, val_every=0, model_dtype="float32",
                   fsdp_cpu_offload=False, optimizer_offload=False, ref_param_offload=False)
    return small


def run_one_step(config: GRPOConfig) -> dict[str, Any]:
    """Build the algorithm of ``config`` on the connected (fake-GPU) cluster and run one
    training step; where its processes landed and the step's reward."""
    algo = config.build_algo()
    try:
        result = algo.train()
        reports = algo.env_runner_group.foreach_env_runner(
            lambda runner: runner.placement_report(), local_env_runner=False)
        learners = algo._placement.check_learners(algo.learner_group) if algo._placement else []
        return {"reward": result.get("critic/score/mean"), "env_runners": reports,
                "learners": learners,
                "transports": algo._weight_sync.transport_names() if algo._weight_sync else {}}
    finally:
        algo.stop()


def add_gpu_memory_arg(p: argparse.ArgumentParser) -> None:
    """``--gpu-memory GIB``: the GPU memory the memory plan checks against."""
    p.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help="memory of one GPU in GiB as CUDA reports it, for the memory plan "
                        "(gpu_memory_gib; default 79.2, an 80 GB H100 or A100)")


def with_gpu_memory(config: GRPOConfig, args: argparse.Namespace) -> GRPOConfig:
    """``config`` with ``--gpu-memory`` as its ``gpu_memory_gib`` where given."""
    if getattr(args, "gpu_memory", None) is not None:
        if not args.gpu_memory > 0:
            raise ConfigError(f"--gpu-memory {args.gpu_memory}: GiB of one GPU, > 0")
        config.training(gpu_memory_gib=args.gpu_memory)
    return config


def add_dry_run_parser(sub: Any) -> None:
    p = sub.add_parser(
        "dry-run", help="place a run's processes on a local cluster with fake GPUs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=__doc__.split("\n\n")[0] + "\n\n" + __doc__.split("\n\n")[2])
    p.add_argument("args", nargs="*", metavar="ARG",
                   help="[file] EXPERIMENT.yaml and/or KEY=VALUE overrides (verl keys too)")
    p.add_argument("-f", "--config-file", metavar="YAML")
    p.add_argument("--config", metavar="JSON", help="config settings as a JSON object")
    p.add_argument("--env", help="gymnasium env id")
    p.add_argument("--nodes", type=int, default=1, help="simulated nodes (default 1)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    p.add_argument("--cpus-per-node", type=int, default=DEFAULT_CPUS_PER_NODE)
    p.add_argument("--step", choices=("auto", "yes", "no"), default="auto",
                   help="run one real training step with a tiny model (auto: where the run "
                        f"has at most {MAX_PROCESSES_FOR_A_STEP} GPU processes)")
    add_gpu_memory_arg(p)


def run_dry_run(config: GRPOConfig, args: argparse.Namespace) -> int:
    """``rllib-grpo dry-run``: print the placed map and the memory plan; 1 if the layout
    does not hold or a GPU runs out of memory in the plan."""
    from rllib_grpo.rllib.config.gpu_layout import planned_transports, unplaceable
    from rllib_grpo.rllib.config.memory import memory_errors, memory_lines

    if config.gpus_per_node and config.gpus_per_node != args.gpus_per_node:
        raise ConfigError(f"the config is laid out for {config.gpus_per_node} GPUs per node "
                          f"(gpus_per_node / trainer.n_gpus_per_node) but --gpus-per-node is "
                          f"{args.gpus_per_node}")
    plan = config.placement_plan()
    cluster = [{"CPU": float(args.cpus_per_node), "GPU": float(args.gpus_per_node)}
               ] * args.nodes
    why = unplaceable(plan, cluster)
    if why:
        print(f"dry-run: the run does not fit {args.nodes} node(s) x {args.gpus_per_node} GPUs: "
              f"{why}")
        return 1
    print("\n".join(memory_lines(config)))
    out_of_memory = memory_errors(config)
    for error in out_of_memory:
        print(f"PROBLEM: {error}")
    quiet_console()  # before Ray starts: its workers inherit the console settings
    start = time.perf_counter()
    with fake_gpu_cluster(args.nodes, args.gpus_per_node, args.cpus_per_node):
        placement, placed = place_stand_ins(config)
        placement.close()
        problems = check_places(config, placed)
        print(f"placed {len(placed)} processes on {args.nodes} node(s) x {args.gpus_per_node} "
              f"GPUs in {time.perf_counter() - start:.1f} s:")
        print("\n".join(placed_map_lines(placed, planned_transports(config, plan))))
        for problem in problems:
            print(f"PROBLEM: {problem}")
        gpu_processes = sum(1 for p in placed if p.gpu_ids)
        if args.step == "yes" or (args.step == "auto"
                                  and gpu_processes <= MAX_PROCESSES_FOR_A_STEP):
            outcome = run_one_step(tiny_step_config(config))
            print(f"one training step with a tiny {config.model_path}-shaped model: reward "
                  f"{outcome['reward']}, weight sync {outcome['transports']}")
        else:
            print(f"no training step: {gpu_processes} GPU processes are more than this "
                  "machine runs at once (--step yes to try)")
    return 1 if problems or out_of_memory else 0
