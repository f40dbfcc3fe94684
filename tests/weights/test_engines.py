"""Which weight-transfer engine carries each transport, and what we hand vLLM's GPU engines
(nccl, ipc: they need GPUs, so the arguments are checked here, on CPU)."""

from __future__ import annotations

import pytest

from rllib_grpo.weights.plan import ENGINE_TRANSPORTS, engine_backend


def test_each_transport_has_its_engine_vllms_on_gpus_ours_in_host_memory_and_for_deltas():
    assert {t: engine_backend(t, "nccl") for t in ENGINE_TRANSPORTS} == {
        "ipc": "ipc", "shm": "grpo_shm", "collective": "nccl", "delta": "grpo_sparse_gloo"}
    assert {t: engine_backend(t, "gloo") for t in ENGINE_TRANSPORTS} == {
        "ipc": "ipc", "shm": "grpo_shm", "collective": "grpo_gloo", "delta": "grpo_sparse_gloo"}
    with pytest.raises(ValueError, match="object_store"):
        engine_backend("object_store")


def test_our_engines_are_registered_with_vllms_factories():
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    from rllib_grpo.weights.engines import register_engines

    register_engines()
    register_engines()  # idempotent
    for name in ("grpo", "grpo_shm", "grpo_gloo", "grpo_sparse_gloo"):
        assert name in WeightTransferEngineFactory._registry
    for name in ("grpo_shm", "grpo_gloo", "grpo_sparse_gloo", "grpo_nccl"):
        assert name in WeightTransferTrainerFactory._registry


def test_vllms_trainer_init_infos_carry_the_group_we_plan():
    import errno
    import socket

    from vllm.distributed.weight_transfer.ipc_engine import IPCTrainerInitInfo
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    from rllib_grpo.weights.trainer import vllm_trainer_init

    nccl = vllm_trainer_init("nccl", host="127.0.0.1", world_size=5, rank=0, timeout_s=7)
    assert isinstance(nccl, NCCLTrainerInitInfo) and nccl.is_sender
    assert (nccl.master_address, nccl.world_size, nccl.timeout_s) == ("127.0.0.1", 5, 7)
    # The port the receivers are told is one the sender holds already: nobody can take it.
    assert nccl.listener.getsockname() == ("127.0.0.1", nccl.master_port)
    with socket.socket() as other, pytest.raises(OSError) as taken:
        other.bind(("127.0.0.1", nccl.master_port))
    assert taken.value.errno == errno.EADDRINUSE
    nccl.listener.close()
    follower = vllm_trainer_init("nccl", host="h", world_size=3, rank=1)
    assert not follower.is_sender and follower.listener is None
    with pytest.raises(ValueError, match="sparse_nccl"):
        vllm_trainer_init("sparse_nccl", host="h", world_size=3, rank=0)
    ipc = vllm_trainer_init("ipc", host="h", world_size=2, rank=0)
    assert isinstance(ipc, IPCTrainerInitInfo) and ipc.backend == "ipc"


def test_the_client_gives_each_runner_its_own_ranks_in_one_group(monkeypatch):
    """vLLM's NCCL engines put "the workers" at rank_offset 1; our runners are separate
    engines, so the client rewrites the offset per runner (and leaves IPC's info alone)."""
    import ray

    from rllib_grpo.rllib.algorithm import weight_client

    sent: list[tuple] = []

    class Handle:
        def __init__(self, index):
            self.apply = type("Apply", (), {"remote": staticmethod(
                lambda func, **kw: sent.append((index, func.__name__, kw)))})

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    client = weight_client.EnvRunnerClient("nccl", {1: Handle(1), 2: Handle(2)}, {1: 1, 2: 3},
                                           token="t")
    client.init_weight_transfer_engine({"master_address": "h", "master_port": 7,
                                        "rank_offset": 1, "world_size": 5})
    offsets = {i: kw["init_info"]["init_info"]["rank_offset"] for i, _, kw in sent}
    assert offsets == {1: 1, 2: 3}
    assert all(kw["init_info"]["backend"] == "nccl" and kw["token"] == "t" for _, _, kw in sent)
    sent.clear()
    client.version = 7
    client.finish_weight_update()
    assert [kw["seq_no"] for _, _, kw in sent] == [7, 7]


def test_the_client_names_the_runners_holding_group_ranks_and_their_nodes():
    from rllib_grpo.rllib.algorithm.weight_client import EnvRunnerClient

    # Runner 2's engine has two workers (ranks 1, 2), runner 5's one (rank 3).
    client = EnvRunnerClient("nccl", {2: None, 5: None}, {2: 1, 5: 3}, token="t",
                             nodes={2: "10.0.0.5", 5: "10.0.0.6"})
    assert client.describe_ranks([2]) == "env runner 2 (node 10.0.0.5)"
    assert client.describe_ranks([3]) == "env runner 5 (node 10.0.0.6)"
    assert client.describe_ranks(None) == client.describe_ranks([1, 2, 3]) == (
        "env runners 2 (node 10.0.0.5), 5 (node 10.0.0.6)")


def test_a_host_engine_sync_is_one_request_per_runner_not_three(monkeypatch):
    """Regression (10x slower syncs on a loaded host): our engines hand the runners start,
    update and finish as one call each, the sender sending meanwhile; the client's separate
    start/update/finish calls (three round trips) are not used."""
    import ray

    from rllib_grpo.rllib.algorithm import weight_client
    from rllib_grpo.rllib.env_runner.weight_receiver import runner_update_round
    from rllib_grpo.weights.trainer import ShmTrainerEngine

    sent: list[tuple] = []

    class Handle:
        def __init__(self, index):
            self.apply = type("Apply", (), {"remote": staticmethod(
                lambda func, **kw: sent.append((index, func, kw)) or f"ref{index}")})

    monkeypatch.setattr(ray, "get", lambda refs: refs)
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: ([], refs))
    client = weight_client.EnvRunnerClient("grpo_shm", {1: Handle(1), 2: Handle(2)},
                                           {1: 1, 2: 2}, token="t")
    client.version = 5
    for name in ("start_weight_update", "update_weights", "finish_weight_update"):
        monkeypatch.setattr(client, name, lambda *a, name=name, **k: pytest.fail(name))
    engine = ShmTrainerEngine(client=client)
    order: list[str] = []
    engine._round({"manifest": "m"}, lambda: order.append(f"sent after {len(sent)} calls"))
    assert [(i, f) for i, f, _ in sent] == [(1, runner_update_round), (2, runner_update_round)]
    assert all(kw == {"update_info": {"manifest": "m"}, "seq_no": 5} for _, _, kw in sent)
    assert order == ["sent after 2 calls"]  # the runners were asked before the bytes went


def test_an_update_round_gives_the_sampler_vllms_three_calls_in_order():
    from rllib_grpo.rllib.env_runner.weight_receiver import runner_update_round

    calls: list[str] = []

    class Sampler:
        def start_weight_update(self):
            calls.append("start")

        def update_weights(self, info):
            calls.append("update")

        def finish_weight_update(self):
            calls.append("finish")

    class Runner:
        sampler = Sampler()
        weight_update: dict = {}

        def weights_received(self, stats, seq_no):
            calls.append(f"received {seq_no}")

    runner_update_round(Runner(), {"manifest": {"buckets": []}}, seq_no=3)
    assert calls == ["start", "update", "finish", "received 3"]
