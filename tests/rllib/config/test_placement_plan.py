"""The placement plan (`rllib_grpo.rllib.config.gpu_layout.placement_plan`): every process of a
run in a bundle of one placement group, one bundle per GPU, at most one learner rank and the
shards of at most one engine on each GPU, an engine's TP shards on one node.  Pure
functions: no Ray (the fake-GPU clusters of tests/rllib/algorithm/test_fake_gpus.py place
the same plan for real)."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.conftest import tiny_config


def _colocated(num_gpus: int, tp: int, **settings):
    return tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp},
                       prompts_per_step=num_gpus, **settings).colocate(num_gpus)


def _per_gpu(plan):
    """GPU bundle -> the roles seated there that hold a share of its GPU."""
    from rllib_grpo.rllib.config.gpu_layout import ENGINE_SHARD, ENV_RUNNER, LEARNER

    seated: dict[int, list[str]] = {}
    for seat in plan.seats:
        if seat.gpus and seat.role in (LEARNER, ENV_RUNNER, ENGINE_SHARD):
            seated.setdefault(seat.bundle, []).append(
                "engine" if seat.role in (ENV_RUNNER, ENGINE_SHARD) else "learner")
    return seated


@pytest.mark.parametrize("num_gpus,tp", [(1, 1), (2, 1), (8, 1), (8, 2), (8, 4), (16, 2)])
def test_colocated_every_gpu_holds_one_learner_rank_and_one_engine_shard(num_gpus, tp):
    from rllib_grpo.rllib.config.gpu_layout import (
        ENGINE_SHARD,
        ENV_RUNNER,
        LEARNER,
        LEARNER_SHARE,
    )

    plan = _colocated(num_gpus, tp).placement_plan()
    gpu_bundles = [i for i, b in enumerate(plan.bundles) if b.gpus]
    assert len(gpu_bundles) == num_gpus and all(plan.bundles[i].gpus == 1 for i in gpu_bundles)
    seated = _per_gpu(plan)
    assert sorted(seated) == gpu_bundles
    assert all(sorted(roles) == ["engine", "learner"] for roles in seated.values())
    # Shares: a learner takes more than half of its GPU (two never fit on one), the engine
    # the rest; together exactly the GPU.
    for bundle in gpu_bundles:
        shares = [s.gpus for s in plan.seats if s.bundle == bundle]
        assert sum(shares) == 1.0
    assert {s.gpus for s in plan.seats_of(LEARNER)} == {LEARNER_SHARE}
    runners = plan.seats_of(ENV_RUNNER)
    assert [r.index for r in runners] == list(range(1, num_gpus // tp + 1))
    if tp == 1:  # the engine runs in its env runner, on the GPU
        assert all(r.gpus for r in runners) and not plan.seats_of(ENGINE_SHARD)
    else:  # the env runner holds no GPU; its TP shards one GPU each
        assert not any(r.gpus for r in runners)
        for runner in runners:
            shards = plan.engine_shards(runner.index)
            assert [s.index for s in shards] == list(range(tp))
            assert len({s.bundle for s in shards}) == tp
    # The bundles vLLM's Ray executor takes: none with more than one GPU.
    assert all(spec.get("GPU", 0) <= 1 for spec in plan.bundle_specs())


def test_tp_groups_never_cross_a_node_of_the_plan():
    plan = _colocated(16, 4, gpus_per_node=8).placement_plan()
    for k in range(1, 5):
        nodes = {plan.bundles[s.bundle].node for s in plan.engine_shards(k)}
        assert len(nodes) == 1, (k, nodes)
    assert Counter(b.node for b in plan.bundles if b.gpus) == {0: 8, 1: 8}


def test_rebind_tiles_tp_groups_on_the_nodes_ray_chose():
    """Ray may put the GPU bundles on nodes in another order than the plan: after the group
    is placed the TP groups are tiled node by node, so no engine spans two nodes."""
    plan = _colocated(8, 2).placement_plan()
    gpu_bundles = [i for i, b in enumerate(plan.bundles) if b.gpus]
    # Interleaved: bundles alternate between two nodes (4 GPUs each).
    nodes = ["head"] * len(plan.bundles)
    for k, bundle in enumerate(gpu_bundles):
        nodes[bundle] = "a" if k % 2 else "b"
    before = {k: {nodes[s.bundle] for s in plan.engine_shards(k)} for k in range(1, 5)}
    assert all(len(v) == 2 for v in before.values())  # as planned they would span nodes
    bound = plan.rebind(nodes)
    for k in range(1, 5):
        assert len({nodes[s.bundle] for s in bound.engine_shards(k)}) == 1
    # Still one shard per GPU bundle.
    assert sorted(s.bundle for k in range(1, 5) for s in bound.engine_shards(k)) == gpu_bundles
    uneven = list(nodes)
    uneven[gpu_bundles[0]] = "c"  # 1 bundle on c, 3 on b: TP 2 cannot tile
    with pytest.raises(ValueError, match="on node c, which engines of tensor parallel 2 cannot"):
        plan.rebind(uneven)


@pytest.mark.parametrize("runners,tp,engine_gpus", [(4, 1, 4), (2, 2, 4)])
def test_separated_learners_and_engines_have_gpus_of_their_own(runners, tp, engine_gpus):
    from rllib_grpo.rllib.config.gpu_layout import ENGINE_SHARD, ENV_RUNNER, LEARNER

    config = tiny_config(sampler="vllm", sampler_config={"tensor_parallel_size": tp},
                         prompts_per_step=8)
    config.learners(num_learners=4, num_gpus_per_learner=1)
    config.env_runners(num_env_runners=runners, num_gpus_per_env_runner=tp)
    plan = config.placement_plan()
    learner_bundles = {s.bundle for s in plan.seats_of(LEARNER)}
    engine_bundles = {s.bundle for s in plan.seats if s.gpus and s.role in (ENV_RUNNER,
                                                                             ENGINE_SHARD)}
    assert len(learner_bundles) == 4 and len(engine_bundles) == engine_gpus
    assert not learner_bundles & engine_bundles
    assert sum(spec.get("GPU", 0) for spec in plan.bundle_specs()) == 8
    assert all(s.gpus == 1 for s in plan.seats if s.gpus)


def test_default_resource_request_is_the_plan_with_reward_workers_and_eval_runners():
    """Tune reserves every actor the run starts: a reward model's workers (on a GPU of their
    own here) and evaluation env runners too, not only RLlib's env runners and learners."""
    from rllib_grpo.rllib.algorithm.grpo import GRPO
    from rllib_grpo.rllib.config.gpu_layout import EVAL_RUNNER, REWARD_WORKER

    config = _colocated(2, 1, reward_funcs=["builtin:tiny-rm"], num_reward_workers=2,
                        num_gpus_per_reward_worker=1)
    config.evaluation(evaluation_interval=1, evaluation_num_env_runners=1,
                      evaluation_config={"num_gpus_per_env_runner": 0})
    plan = config.placement_plan()
    request = GRPO.default_resource_request(config)
    assert request.bundles == plan.bundle_specs()
    assert request.required_resources["GPU"] == 4  # 2 colocated + 2 reward workers
    rewards = plan.seats_of(REWARD_WORKER)
    assert [s.label for s in rewards] == ["reward worker builtin_tiny-rm[0]",
                                            "reward worker builtin_tiny-rm[1]"]
    assert all(plan.bundles[s.bundle].resources() == {"CPU": 1.0, "GPU": 1.0} for s in rewards)
    assert len(plan.seats_of(EVAL_RUNNER)) == 1


def test_a_cpu_run_reserves_its_reward_worker_in_the_trial():
    """`rllib train ... reward_model.enable=True` on 2 CPUs waited forever: the reward
    worker asked for a CPU in a trial whose only bundle the algorithm held."""
    from rllib_grpo.rllib.algorithm.grpo import GRPO
    from rllib_grpo.rllib.config.gpu_layout import unplaceable

    config = tiny_config(reward_model_enable=True, reward_model_path="builtin:tiny-rm")
    request = GRPO.default_resource_request(config)
    assert request.bundles == [{"CPU": 1.0}, {"CPU": 1.0}]  # main process, reward worker
    plan = config.placement_plan()
    assert unplaceable(plan, [{"CPU": 2.0}]) is None
    why = unplaceable(plan, [{"CPU": 1.0}])
    assert why is not None and why.startswith("reward worker")  # names the actor


def test_unplaceable_names_what_does_not_fit():
    from rllib_grpo.rllib.config.gpu_layout import unplaceable

    plan = _colocated(8, 2).placement_plan()
    assert unplaceable(plan, [{"CPU": 16, "GPU": 8}]) is None
    assert unplaceable(plan, [{"CPU": 8, "GPU": 4}, {"CPU": 8, "GPU": 4}]) is None
    why = unplaceable(plan, [{"CPU": 16, "GPU": 7}])
    assert why is not None and "learner" in why and "1 GPU" in why
    strict = _colocated(2, 1)
    strict.resources(placement_strategy="STRICT_PACK")
    assert "must fit on one node" in unplaceable(strict.placement_plan(),
                                                 [{"CPU": 2, "GPU": 1}, {"CPU": 2, "GPU": 1}])


def test_the_gpu_map_of_verls_qwen3_8b_line(tmp_path):
    """verl's Qwen3-8B line on 1 x 8: one row per GPU, the learner rank and the engine's TP
    shard there; DAPO-7B's 8 nodes x 8 with TP 4: every TP group inside one node."""
    from rllib_grpo.cli.build import build_config
    from rllib_grpo.cli.main import build_parser
    from tests.helpers.verl_scripts import script_overrides

    def config_of(script):
        from rllib_grpo.cli.main import assemble_from_args

        _, overrides = script_overrides(script, tmp_path)
        overrides = [o for o in overrides if "ulysses_sequence_parallel_size" not in o]
        args = build_parser().parse_args(["explain"])
        return build_config(assemble_from_args(args, None, overrides))

    qwen = config_of("run_qwen3_8b_fsdp.sh")
    text = qwen.explain()
    assert "      0    3  rank 3     engine 2 shard 1" in text
    assert "8 GPU(s) on 1 node(s) of 8" in text
    dapo = config_of("test_dapo_7b_math.sh").placement_plan()
    assert dapo.gpus_per_node == 8 and dapo.engine_tp == 4
    for k in range(1, 17):
        assert len({dapo.bundles[s.bundle].node for s in dapo.engine_shards(k)}) == 1
