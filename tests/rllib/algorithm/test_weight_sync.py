"""Weight sync through GRPO on the tiny model: each transport on CPU (our engines, driven
through vLLM's weight-transfer API: init, start, update, finish) leaves the sampler with
exactly the learner's weights (fp32), and the object store is used only where no faster
path applies."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config


def _learner_state(algo) -> dict[str, torch.Tensor]:
    from ray.rllib.core import DEFAULT_MODULE_ID

    module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
    return {k: v.detach().clone() for k, v in module.lm.state_dict().items()}


def _remote_sampler_state(algo) -> dict[str, torch.Tensor]:
    return algo.env_runner_group.foreach_env_runner(
        lambda er: {k: v.clone() for k, v in er.sampler.model.state_dict().items()},
        local_env_runner=False)[0]


def _assert_equal(sampler: dict, learner: dict) -> None:
    assert set(sampler) == set(learner)
    for name, tensor in learner.items():
        assert torch.equal(sampler[name], tensor), name


def _forget_group(runner) -> None:
    """What a restarted runner looks like: no weight group."""
    runner.sampler.leave_weight_group()
    runner.weight_group_token = None


def test_local_sync_hands_over_the_learners_own_tensors(ray_session):
    from rllib_grpo.weights.plan import TRANSPORT_CODES

    algo = tiny_config(lr=1e-2).build_algo()
    try:
        sampler = algo.env_runner.sampler
        storage = {n: p.data_ptr() for n, p in sampler.model.named_parameters()}
        before = _learner_state(algo)
        result = algo.train()
        after = _learner_state(algo)
        assert any(not torch.equal(before[k], after[k]) for k in after)  # the update moved it
        assert algo._weight_sync.transport_names() == {0: "local"}
        assert result["weight_sync/transport"] == TRANSPORT_CODES["local"]
        assert result["weight_sync/bytes"] > 0 and result["weight_sync/gbps"] > 0
        _assert_equal(sampler.model.state_dict(), after)
        # Copied in place into the sampler's parameters ...
        assert {n: p.data_ptr() for n, p in sampler.model.named_parameters()} == storage
        # ... from the learner's live tensors: no host copy, no clone.
        lm = algo.learner_group._learner.module["default_policy"].unwrapped().lm
        handed = algo.learner_group._learner.weight_sender.local_state()
        assert all(handed[k].data_ptr() == v.data_ptr() for k, v in lm.state_dict().items())
    finally:
        algo.stop()


def _engines(algo) -> set[str]:
    return set(algo.learner_group._learner.weight_sender.engines)


@pytest.fixture(scope="class")
def remote_run(ray_session):
    """One GRPO with a remote env runner for the tests of the remote transports (one runner
    start, not one per test).  It is built with ``weight_sync_transport="collective"`` and
    trains once: what that first sync chose is recorded.  Every test then sets the transport
    it checks (``use_transport``: the configured setting's own planning, on the live runner).
    Class-scoped: stopped before the tests after the class build algorithms of their own."""
    config = tiny_config(lr=1e-2, weight_sync_transport="collective", weight_sync_bucket_mb=0.05)
    config.env_runners(num_env_runners=1)  # no env runner in the driver: GRPO's default
    algo = config.build_algo()
    try:
        algo.train()
        yield {"algo": algo, "configured": algo._weight_sync.transport_names()}
    finally:
        algo.stop()


class TestRemoteTransports:
    """The remote transports, on one live runner (`remote_run`)."""

    def test_the_configured_transport_is_used_from_the_first_sync(self, remote_run):
        assert remote_run["configured"] == {1: "collective"}

    def test_the_driver_holds_no_env_runner_beside_a_remote_one(self, remote_run):
        """RLlib's default would build one (a sampler that never samples) and sync it."""
        assert remote_run["algo"].env_runner_group.local_env_runner is None

    @pytest.mark.parametrize("setting,transport", [
        ("auto", "shm"),
        ("collective", "collective"),
        ("delta", "delta"),
        pytest.param("object_store", "object_store", marks=pytest.mark.slow),
    ])
    def test_remote_env_runner_gets_the_learners_weights_exactly(self, remote_run, setting,
                                                                 transport):
        from rllib_grpo.weights.plan import TRANSPORT_CODES

        algo = remote_run["algo"]
        algo._weight_sync.use_transport(setting)
        for _ in range(2):  # the second sync reuses the group and the slots
            result = algo.train()
            _assert_equal(_remote_sampler_state(algo), _learner_state(algo))
        assert algo._weight_sync.transport_names() == {1: transport}
        assert result["weight_sync/transport"] == TRANSPORT_CODES[transport]
        assert result["env_runners"]["weight_sync/bytes"] > 0
        if transport == "object_store":
            return
        if transport == "delta":  # lr=1e-2 moves most elements; 0 < changed <= all
            assert 0 < result["weight_sync/changed_frac"] <= 1
        else:
            assert result["weight_sync/bytes"] > 2 * 0.05 * 2**20  # several 0.05 MiB buckets
        # A restarted runner (as RLlib counts them) lost its engine: it connects again.
        tokens = dict(algo._weight_sync._tokens)
        assert len(tokens) == 1
        algo.env_runner_group.foreach_env_runner(_forget_group, local_env_runner=False)
        algo.env_runner_group._worker_manager._num_actor_restarts += 1
        algo.train()
        assert algo._weight_sync._tokens.keys() == tokens.keys()
        assert set(algo._weight_sync._tokens.values()).isdisjoint(tokens.values())
        _assert_equal(_remote_sampler_state(algo), _learner_state(algo))

    def test_a_runner_re_joined_with_another_backend_syncs_through_it(self, remote_run):
        """A runner holds one engine: switching its transport (``use_transport``, a re-plan)
        re-joins it with another backend.  Before, the old engine stayed connected on the
        learner with a group whose peer had left, and a send through it failed with gloo's
        "Connection closed by peer"; now each switch shuts the old engine down and the next
        sync goes through the new one, exactly, in both directions and back."""
        algo = remote_run["algo"]
        sync = algo._weight_sync
        sync.use_transport("auto")
        algo.train()
        assert sync.transport_names() == {1: "shm"} and _engines(algo) == {"grpo_shm"}
        for setting, transport, backend in (("collective", "collective", "grpo_gloo"),
                                            ("shm", "shm", "grpo_shm"),
                                            ("delta", "delta", "grpo_sparse_gloo"),
                                            ("shm", "shm", "grpo_shm")):
            sync.use_transport(setting)
            algo.train()
            assert sync.transport_names() == {1: transport}
            assert _engines(algo) == {backend}  # the old one shut down, not left dangling
            assert set(sync._tokens) == {backend}
            _assert_equal(_remote_sampler_state(algo), _learner_state(algo))
        # Away from any engine: the runner leaves its group too.
        sync.use_transport("object_store")
        algo.train()
        assert _engines(algo) == set() and sync._tokens == {}
        assert algo.env_runner_group.foreach_env_runner(
            lambda er: er.sampler._weight_receiver.token, local_env_runner=False) == [None]
        _assert_equal(_remote_sampler_state(algo), _learner_state(algo))
        with pytest.raises(ValueError, match="use one of"):
            sync.use_transport("nvlink")


def test_a_weight_engine_that_cannot_connect_stops_the_run_under_auto_too(ray_session,
                                                                          monkeypatch):
    """Regression: with ``auto`` a failed connect moved the rest of the run to Ray's object
    store after one warning.  It is the run's error now, the learner's one line as it is;
    the connect got ``weight_sync_connect_timeout_s``."""
    from rllib_grpo.rllib.learner import weight_sender

    line = ("weight sync: env runner 1 (node 10.0.0.5) did not join the gloo group at "
            "10.0.0.2:41233 within 7 s: open TCP port 41233 (and gloo's ports) between the "
            "nodes, or set weight_sync_transport='object_store'")
    timeouts = []

    def unreachable(self, backend, world_size, client, timeout_s):
        timeouts.append(timeout_s)
        raise TimeoutError(line)

    monkeypatch.setattr(weight_sender.WeightSender, "connect", unreachable)
    config = tiny_config(lr=1e-2, weight_sync_connect_timeout_s=7)
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    algo = config.build_algo()
    try:
        with pytest.raises(TimeoutError) as failed:
            algo.train()
        assert str(failed.value) == line
        assert timeouts == [7]
        assert algo._weight_sync.transport_names() == {1: "shm"}  # nothing fell back
    finally:
        algo.stop()


def _has_direct_entries(learner) -> bool:
    return any(bucket.direct for bucket in learner.weight_sender.manifest.buckets)


def _send_large_tensors_directly(learner) -> None:
    from rllib_grpo.rllib.learner import weight_sender

    weight_sender.DIRECT_MIN_BYTES = 1024


@pytest.mark.slow
def test_fsdp_learners_gather_each_bucket_from_their_shards(ray_session):
    """Two FSDP2 learners (Ray Train workers), a remote env runner: every tensor is gathered
    from the shards bucket by bucket on both learners and sent by rank 0."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    config = tiny_config(weight_sync_bucket_mb=0.05)
    config.learners(num_learners=2, num_cpus_per_learner=1)
    # The test session has 2 CPUs, both the learners': the runner asks for none.
    config.env_runners(num_env_runners=1, create_local_env_runner=False,
                       num_cpus_per_env_runner=0)
    config.resources(num_cpus_for_main_process=0)
    algo = config.build_algo()
    try:
        group = algo.learner_group
        weights = group.get_weights()[DEFAULT_MODULE_ID]
        generator = torch.Generator().manual_seed(0)
        moved = {k: v + 0.05 * torch.randn(v.shape, generator=generator)
                 for k, v in weights.items()}
        moved["lm_head.weight"] = moved["model.embed_tokens.weight"]  # tied
        group.set_weights({DEFAULT_MODULE_ID: moved})
        # Tensors of >= 1 KiB go from where they lie, the rest packed: both in one order.
        group.foreach_learner(_send_large_tensors_directly)
        algo._sync_weights()
        assert algo._weight_sync.transport_names() == {1: "shm"}
        _assert_equal(_remote_sampler_state(algo), moved)
        # The same again through a gloo broadcast, where direct entries travel apart.
        algo._weight_sync.transports, algo._weight_sync.backends = {1: "collective"}, {
            "grpo_gloo": [1]}
        group.set_weights({DEFAULT_MODULE_ID: weights})
        algo._sync_weights()
        _assert_equal(_remote_sampler_state(algo), weights)
        assert all(group._get_results(group.foreach_learner(_has_direct_entries)))
    finally:
        algo.stop()


@pytest.mark.slow
def test_remote_learner_reaches_the_drivers_env_runner_through_the_object_store(ray_session):
    """``num_learners=1``: the learner is an actor and the env runner lives in the driver,
    which a learner's weight engine cannot call: Ray's object store."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    config = tiny_config(lr=1e-2, weight_sync_bucket_mb=0.05)
    config.learners(num_learners=1, num_cpus_per_learner=1)
    config.resources(num_cpus_for_main_process=0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
            learner = algo.learner_group.get_weights()[DEFAULT_MODULE_ID]
            _assert_equal(algo.env_runner.sampler.model.state_dict(), learner)
        assert algo._weight_sync.transport_names() == {0: "object_store"}
    finally:
        algo.stop()


def test_a_sync_with_every_runner_out_of_service_sends_nothing():
    """Every remote runner out of service (Ray's OOM killer took it; RLlib restarts it) and
    no local one: before, ``max()`` of no transports raised a bare ValueError out of
    `WeightSync.sync`; now the sync reports nothing sent (the runners' set, recorded, moves
    when one is back, and the sync after that places and connects it)."""
    from types import SimpleNamespace

    from rllib_grpo.rllib.algorithm.weight_sync import WeightSync
    from rllib_grpo.weights.plan import Endpoint

    sender = SimpleNamespace(endpoint=lambda: Endpoint("node", 1), state_nbytes=lambda: 8)
    learner = SimpleNamespace(weight_sender=sender)
    runners = SimpleNamespace(healthy_worker_ids=lambda: [], num_remote_env_runners=lambda: 1,
                              num_remote_worker_restarts=lambda: 0, local_env_runner=None)
    algo = SimpleNamespace(
        config=SimpleNamespace(weight_sync_transport="auto", weight_sync_bucket_mb=1.0,
                               weight_sync_connect_timeout_s=300.0),
        env_runner_group=runners,
        learner_group=SimpleNamespace(foreach_learner=lambda func: [func(learner)],
                                      _get_results=lambda results: results))
    sync = WeightSync(algo)
    try:
        assert sync.sync() == {"weight_sync/bytes": 0.0, "weight_sync/gbps": 0.0}
        assert sync.transport_names() == {}
        assert sync._members == ((), 0)  # a runner back in service changes it: rediscovery
    finally:
        sync.close()
