"""GPU layouts placed on Ray clusters that only declare their GPUs (the fake-GPU test bed,
`RLLIB_GRPO_FAKE_GPUS=1`): every process asserts from inside where it landed
(``ray.get_gpu_ids()``, its node, the GPUs its engine's TP shards hold), and the real
algorithm runs a training step there.  Each cluster lives in a process of its own
(`tests/helpers/fake_gpu_check.py`); every run waits at most ``startup_timeout_s`` for its
placement, so a layout Ray cannot place fails instead of hanging.

The default suite places 1 node x 2 GPUs (verl's one-GPU layout beside a reward model on a
GPU of its own, as a Tune trial), 2 nodes x 2 GPUs (colocated engines of TP 2) and verl's
Qwen3-8B line on 1 x 8 (stand-ins, through ``rllib-grpo dry-run``); `make test-slow` adds
the 8- and 16-GPU shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tests.conftest import REPO_ROOT

# Ray clusters with fake GPUs, in subprocesses.
pytestmark = pytest.mark.ray


def _run(spec: dict, timeout: int = 600) -> dict:
    proc = subprocess.run([sys.executable, "tests/helpers/fake_gpu_check.py", json.dumps(spec)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(lines[-1][len("RESULT "):])


def _same_transports_as_explain(run: dict, expected: dict[str, str]) -> None:
    """The weight transport of each env runner in the run is the one ``explain`` prints:
    the endpoints describe the GPUs Ray assigned, so the planner decides as for real GPUs
    (the bytes then move on the CPU, through shared memory)."""
    assert run["transports"] == run["planned"] == expected, (run["transports"], run["planned"])


def _gpu(where: dict) -> tuple[str, str]:
    (gpu,) = where["gpu_ids"]  # exactly one GPU id
    assert where["cuda_visible_devices"] == gpu  # and the process sees that one alone
    return where["node_id"], gpu


def test_one_gpu_colocated_and_a_reward_model_on_its_own_gpu_as_a_tune_trial():
    """verl's one-GPU layout (`colocate(1)`): the learner and the engine share GPU 0; the
    reward model's worker (counted in the trial's resources) holds GPU 1; one iteration."""
    out = _run({"nodes": 1, "gpus_per_node": 2, "runs": [
        {"layout": {"colocate": 1, "reward_gpus": 1}, "how": "tune"}]})
    run = out["runs"][0]
    assert run["iterations"] == 1
    (learner,) = run["learners"]
    runner = run["env_runners"]["1"]
    assert _gpu(learner) == _gpu(runner["runner"]) == _gpu(runner["engine"][0])
    (reward,) = run["reward_workers"]
    assert _gpu(reward)[1] != _gpu(learner)[1]
    assert run["bundles"] == [{"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}, {"CPU": 1.0, "GPU": 1.0}]
    _same_transports_as_explain(run, {"1": "ipc"})


def test_two_nodes_colocated_engines_of_tp_two_step():
    """4 GPUs on 2 nodes, rollout TP 2 (`colocate(4)`): every GPU holds one learner rank and
    one engine shard, each engine's 2 shards on one node, the env runners (no GPU of their
    own) see none; one training step through the real learners and env runners."""
    out = _run({"nodes": 2, "gpus_per_node": 2, "runs": [
        {"layout": {"colocate": 4, "tp": 2}, "how": "build"}]})
    run = out["runs"][0]
    assert run["iterations"] == 1 and run["reward"] is not None
    learner_gpus = [_gpu(p) for p in run["learners"]]
    assert len(set(learner_gpus)) == 4 and Counter(n for n, _ in learner_gpus) == Counter(
        {out["nodes"][0]: 2, out["nodes"][1]: 2})
    shard_gpus = []
    for index, report in run["env_runners"].items():
        assert report["runner"]["gpu_ids"] == [] and report["runner"]["cuda_visible_devices"] == ""
        shards = [_gpu(s) for s in report["engine"]]
        assert len(shards) == 2 and len({n for n, _ in shards}) == 1, (index, shards)
        shard_gpus += shards
    assert sorted(shard_gpus) == sorted(learner_gpus)  # one shard on each learner's GPU
    _same_transports_as_explain(run, {"1": "ipc", "2": "ipc"})


def test_verls_qwen3_8b_line_dry_runs_on_one_node_of_eight(tmp_path):
    """`rllib-grpo dry-run` of verl's Qwen3-8B line: 8 learners and 4 engines of TP 2 on 1 x 8
    fake GPUs, one row per GPU with its learner rank and engine shard, no problem found."""
    from tests.helpers.verl_scripts import script_overrides

    _, overrides = script_overrides("run_qwen3_8b_fsdp.sh", tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_grpo.cli.main", "dry-run", *overrides, "--nodes", "1",
         "--gpus-per-node", "8", "--step", "no"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.strip()[:1].isdigit() and "engine" in line]
    assert len(rows) == 8
    for gpu, row in enumerate(rows):
        node, index, _, rank, _, engine, _, shard = row[:8]
        assert (node, index, rank) == ("0", str(gpu), str(gpu))
        assert (engine, shard) == (str(gpu // 2 + 1), str(gpu % 2)), row
    assert "PROBLEM" not in proc.stdout
    assert "without a GPU: env runner 1, env runner 2, env runner 3, env runner 4" in proc.stdout
    assert "node 0 GPUs 0-7 (alike): GiB by phase" in proc.stdout  # the memory plan


LAYOUTS_ON_EIGHT = [
    {"colocate": 8, "tp": 1},
    {"colocate": 8, "tp": 2, "learners_first": True},
    {"colocate": 8, "tp": 4},
    {"learners": 4, "engines": 4, "tp": 1},
    {"learners": 4, "engines": 2, "tp": 2},
]


@pytest.mark.slow
def test_every_eight_gpu_layout_is_placed_exactly():
    """On 1 x 8: colocated with TP 1, 2 (the learners placed first: order does not matter)
    and 4, and separated (4 learners + 4 engines of TP 1, 4 learners + 2 of TP 2): no two
    learners or engines on one GPU, colocated GPUs hold one of each, TP groups on one node."""
    out = _run({"nodes": 1, "gpus_per_node": 8, "cpus_per_node": 16,
                "runs": [{"layout": layout, "how": "stand-ins"} for layout in LAYOUTS_ON_EIGHT]},
               timeout=900)
    for layout, run in zip(LAYOUTS_ON_EIGHT, out["runs"], strict=True):
        assert run["problems"] == [], layout
        gpus = Counter(g for p in run["placed"] for g in p["gpu_ids"])
        assert sorted(gpus) == [str(i) for i in range(8)], layout  # every GPU used
        if "colocate" in layout:
            assert set(gpus.values()) == {2}, layout  # a learner and an engine shard each


@pytest.mark.slow
def test_sixteen_gpus_on_two_nodes_colocated_tp_two():
    out = _run({"nodes": 2, "gpus_per_node": 8, "cpus_per_node": 16, "runs": [
        {"layout": {"colocate": 16, "tp": 2}, "how": "stand-ins"}]}, timeout=900)
    run = out["runs"][0]
    assert run["problems"] == []
    per_node = Counter(p["node"] for p in run["placed"] if p["role"] == "learner")
    assert per_node == Counter({0: 8, 1: 8})


@pytest.mark.slow
def test_two_gpus_colocated_and_separated_steps_built_in_a_driver():
    out = _run({"nodes": 1, "gpus_per_node": 2, "runs": [
        {"layout": {"colocate": 2, "tp": 1}, "how": "build"},
        {"layout": {"learners": 1, "engines": 1, "tp": 1}, "how": "build"}]})
    _same_transports_as_explain(out["runs"][1], {"1": "nccl"})  # an engine on its own GPU
    run = out["runs"][0]
    learner_gpus = sorted(_gpu(p) for p in run["learners"])
    runner_gpus = sorted(_gpu(r["runner"]) for r in run["env_runners"].values())
    assert learner_gpus == runner_gpus and len(set(learner_gpus)) == 2
    _same_transports_as_explain(run, {"1": "ipc", "2": "ipc"})


RLLIB_BUNDLES_CHECK = """
import ray, sys
sys.path.insert(0, ".")
from ray.util.placement_group import placement_group, remove_placement_group
from tests.conftest import tiny_config
ray.init(address="local", num_cpus=16, num_gpus=8, include_dashboard=False, log_to_driver=False)
config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": 2},
                     prompts_per_step=8).colocate(8)
fractional = ([{"CPU": 1}] + [{"CPU": 1, "GPU": config.num_gpus_per_env_runner}] * 4
              + [{"GPU": config.num_gpus_per_learner}] * 8)
for name, bundles in (("fractional", fractional), ("plan", config.placement_plan().bundle_specs())):
    group = placement_group(bundles, strategy="PACK")
    ready, _ = ray.wait([group.ready()], timeout=10)
    print(name, bool(ready))
    remove_placement_group(group)
"""


def test_rllibs_fractional_bundles_of_verls_layout_never_place_but_the_plans_do():
    """What RLlib's own resource request gave verl's layout on 8 GPUs (4 env runners of 0.25
    GPU, 8 learners of 0.75): Ray's best fit stacks the 0.25s on one GPU and the 8th learner
    never fits, so the trial waits forever; the plan's one-bundle-per-GPU group is placed."""
    proc = subprocess.run([sys.executable, "-c", RLLIB_BUNDLES_CHECK], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["fractional", "False", "plan", "True"], proc.stdout


@pytest.mark.slow
def test_verls_dapo_7b_line_dry_runs_on_two_nodes_of_eight(tmp_path):
    """verl's DAPO-7B math line (rollout TP 4; its 8 nodes given as 2 here): 16 learners and
    4 engines of TP 4, every TP group inside one node."""
    from tests.helpers.verl_scripts import script_overrides

    _, overrides = script_overrides("test_dapo_7b_math.sh", tmp_path, {"NNODES": "2"})
    overrides = [o for o in overrides if "ulysses_sequence_parallel_size" not in o]
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_grpo.cli.main", "dry-run", *overrides, "--nodes", "2",
         "--gpus-per-node", "8", "--step", "no"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "PROBLEM" not in proc.stdout
    rows = [line.split() for line in proc.stdout.splitlines()
            if line.strip()[:1].isdigit() and "engine" in line]
    assert len(rows) == 16
    nodes_of_engine: dict[str, set[str]] = {}
    for row in rows:
        nodes_of_engine.setdefault(row[5], set()).add(row[0])
    assert len(nodes_of_engine) == 4 and all(len(n) == 1 for n in nodes_of_engine.values())
