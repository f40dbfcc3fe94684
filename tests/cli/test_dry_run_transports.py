"""``rllib-grpo dry-run`` names a weight transport, as the processes landed, other than the
plan's: the planner on the GPUs Ray assigned the stand-ins (no Ray here: their places)."""

from __future__ import annotations

from rllib_grpo.cli.dry_run import Placed, check_places, placed_transports
from tests.conftest import tiny_config


def _placed(role: str, name: str, node: int, gpu: str, engine: int | None = None) -> Placed:
    return Placed(name, role, node, (gpu,), gpu, engine)


def test_the_transport_as_placed_is_the_plans_or_a_problem():
    separated = tiny_config(sampler="vllm")
    separated.learners(num_learners=1, num_gpus_per_learner=1)
    separated.env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    as_planned = [_placed("learner", "learner 0", 0, "1"),
                  _placed("env runner", "env runner 1", 0, "0", engine=1)]
    assert placed_transports(separated, as_planned) == {1: "nccl"}
    assert check_places(separated, as_planned) == []
    # The engine landed on the learner's GPU: the run would take CUDA IPC, not the plan's
    # NCCL group (and two ranks of one group on a GPU besides).
    stacked = [_placed("learner", "learner 0", 0, "0"),
               _placed("env runner", "env runner 1", 0, "0", engine=1)]
    assert placed_transports(separated, stacked) == {1: "ipc"}
    assert any("the weight sync would take ipc (env runner 1); the plan says nccl "
               "(env runner 1)" in p for p in check_places(separated, stacked))
    colocated = tiny_config(sampler="vllm").colocate(1)
    assert placed_transports(colocated, stacked) == {1: "ipc"}
