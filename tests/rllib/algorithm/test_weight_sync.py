"""The driver's weight sync (`WeightSync`): on CPU through GRPO on the tiny model, each path
leaves the samplers with exactly the learner's weights (fp32; bf16 as the learner casts);
the orchestration of vLLM's GPU engines (``ipc`` chunk by chunk, ``nccl`` both sides at
once) with recording stand-ins for the learners and the engines' workers: the calls vLLM's
engines receive, in order.  Killed and stalled receivers: test_weight_sync_faults.py."""

from __future__ import annotations

import base64
import contextlib
import socket
import time
from types import SimpleNamespace

import pytest
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from tests.conftest import tiny_config


def _learner_state(algo) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in algo.learner_group.get_weights()[DEFAULT_MODULE_ID].items()}


def _remote_sampler_states(algo) -> list[dict[str, torch.Tensor]]:
    return algo.env_runner_group.foreach_env_runner(
        lambda er: {k: v.clone() for k, v in er.sampler.model.state_dict().items()},
        local_env_runner=False)


def _assert_equal(sampler: dict, learner: dict) -> None:
    assert set(sampler) == set(learner)
    for name, tensor in learner.items():
        assert torch.equal(sampler[name], tensor), name


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


def test_remote_runners_read_the_shared_file_in_the_samplers_dtype(ray_session):
    """Two remote runners (transformers samplers in bf16) read one shared file per sync:
    the learner's fp32 weights cast once, round to nearest, as the learner casts them."""
    from rllib_grpo.weights.plan import TRANSPORT_CODES

    config = tiny_config(lr=1e-2, sampler_config={"dtype": "bfloat16"})
    config.env_runners(num_env_runners=2, num_cpus_per_env_runner=0.5)
    algo = config.build_algo()
    try:
        for _ in range(2):  # the second sync writes the same file again
            result = algo.train()
            learner = {k: v.to(torch.bfloat16) for k, v in _learner_state(algo).items()}
            for state in _remote_sampler_states(algo):
                _assert_equal(state, learner)
        assert algo._weight_sync.transport_names() == {1: "shm", 2: "shm"}
        assert result["weight_sync/transport"] == TRANSPORT_CODES["shm"]
        nbytes = sum(v.numel() * 2 for k, v in learner.items() if k != "lm_head.weight")
        assert result["weight_sync/bytes"] >= nbytes  # each tensor once, aligned
        assert result["env_runners"]["weight_sync/bytes"] == result["weight_sync/bytes"]
        assert result["fault_tolerance/weight_sync_dropped_receivers"] == 0
        seq_no = algo.learner_group._learner.weight_sender.seq_no
        assert algo.env_runner_group.foreach_env_runner(
            lambda er: er._weights_seq_no, local_env_runner=False) == [seq_no, seq_no]
    finally:
        algo.stop()


def test_a_sync_with_every_runner_out_of_service_sends_nothing():
    """Every remote runner out of service (Ray's OOM killer took it; RLlib restarts it) and
    no local one: the sync reports nothing sent, and looks again at the next sync."""
    from rllib_grpo.rllib.algorithm.weight_sync import WeightSync

    sender = SimpleNamespace(endpoint=lambda: {"rank": 0, "node_id": "node", "pid": 1,
                                               "device": "cpu", "gpus": (),
                                               "host_payload": False})
    learner = SimpleNamespace(weight_sender=sender)
    learners = SimpleNamespace(is_local=True,
                               foreach_learner=lambda func, **_: [SimpleNamespace(
                                   ok=True, get=lambda: func(learner), actor_id=None)])
    runners = SimpleNamespace(healthy_worker_ids=lambda: [], num_remote_env_runners=lambda: 1,
                              num_remote_worker_restarts=lambda: 0, local_env_runner=None)
    algo = _algo(runners, _Sized(learners, 0))
    sync = WeightSync(algo)
    try:
        assert sync.sync() == {"weight_sync/bytes": 0.0, "weight_sync/gbps": 0.0,
                               "fault_tolerance/weight_sync_dropped_receivers": 0.0}
        assert sync.transport_names() == {}
    finally:
        sync.close()


# --------------------------------------------------------------------------- vLLM's engines
def _algo(runner_group, learner_group) -> SimpleNamespace:
    """The algorithm as a `WeightSync` uses it, its deadlines never reached (the calls run
    in this process: test_weight_sync_faults.py has the deadlines)."""
    deadlines = SimpleNamespace(timeout_and_rule=lambda phase: (60.0, "a test's"),
                                watch=lambda *args, **kwargs: contextlib.nullcontext(),
                                record=lambda phase, seconds: None)
    return SimpleNamespace(config=tiny_config(), env_runner_group=runner_group,
                           learner_group=learner_group, deadlines=deadlines,
                           waiting_on_learners=lambda phase, call, **_: contextlib.nullcontext())


class _Sized:
    """A stand-in group with ``len`` (RLlib's ``LearnerGroup.__len__``: its remote learners)."""

    def __init__(self, group, size: int) -> None:
        self.group, self.size = group, size

    def __getattr__(self, name):
        return getattr(self.group, name)

    def __len__(self) -> int:
        return self.size


class _Result:
    def __init__(self, actor_id: int, value) -> None:
        self.actor_id, self.ok, self._value = actor_id, True, value

    def get(self):
        return self._value


class _Sender:
    """A learner rank's `WeightSender`, its GPU parts recorded: two ``ipc`` chunks, then
    none; an NCCL group it joins and broadcasts into."""

    def __init__(self, rank: int, gpu: str, calls: list) -> None:
        self.rank, self.gpu, self.calls, self.seq_no = rank, gpu, calls, 4
        self.chunks: list | None = None

    def endpoint(self):
        return {"rank": self.rank, "node_id": "node", "pid": 10 + self.rank, "device": "cuda",
                "gpus": (self.gpu,), "host_payload": False}

    def metadata(self, wire_dtype):
        return [("model.embed_tokens.weight", torch.bfloat16, (50, 16)),
                ("lm_head.weight", torch.bfloat16, (50, 16))]

    def ipc_next(self, wire_dtype, buffer_bytes):
        if self.chunks is None:
            self.chunks = [{"names": [f"chunk{k}"], "dtype_names": ["bfloat16"],
                            "shapes": [[50, 16]], "ipc_handles": {"GPU-A": k, "GPU-B": k},
                            "tensor_sizes": [1600]} for k in (1, 2)]
        if not self.chunks:
            self.chunks = None
            return None
        chunk = self.chunks.pop(0)
        return chunk if self.rank == 0 else {}

    def nccl_unique_id(self):
        return "uid" if self.rank == 0 else None

    def nccl_join(self, unique_id, world_size):
        self.calls.append(("learner join", self.rank, (unique_id, world_size)))

    def nccl_send(self, wire_dtype, buffer_bytes):
        self.calls.append(("learner send", self.rank, None))


def _vllm_runner(index: int, gpus: tuple, backend: str, calls: list):
    from rllib_grpo.samplers.vllm_weights import VLLMWeightTransfer

    class Llm:
        llm_engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))

        def collective_rpc(self, method, kwargs=None):
            if callable(method):  # worker_gpu_uuid: one answer per worker
                return list(gpus)
            calls.append((index, method, kwargs))
            return [None] * len(gpus)

        def reset_prefix_cache(self):
            calls.append((index, "reset_prefix_cache", None))

    class Sampler(VLLMWeightTransfer):
        on_cpu, tied_embeddings, _checkpoint_keys = False, True, set()
        weight_transfer_backend = backend
        llm = Llm()

    class Runner:
        worker_index, engine_shards = index, []
        config = SimpleNamespace(sampler="vllm")
        sampler = Sampler()
        received: list = []

        def weights_received(self, stats, seq_no):
            self.received.append((stats["bytes"], seq_no))

    return Runner()


def _gpu_sync(backend: str, runner_gpus: dict[int, tuple]):
    """A `WeightSync` over two learner ranks on GPUs A and B and vLLM runners on
    ``runner_gpus``, every call in this process, recorded in ``calls``."""
    from rllib_grpo.rllib.algorithm.weight_sync import WeightSync

    calls: list = []
    learners = [SimpleNamespace(weight_sender=_Sender(rank, gpu, calls))
                for rank, gpu in enumerate(("GPU-A", "GPU-B"))]
    runners = {i: _vllm_runner(i, gpus, backend, calls) for i, gpus in runner_gpus.items()}
    learner_group = _Sized(SimpleNamespace(
        is_local=False, foreach_learner=lambda func, **_: [
            _Result(rank, func(learner)) for rank, learner in enumerate(learners)]), 2)
    runner_group = SimpleNamespace(
        healthy_worker_ids=lambda: sorted(runners), num_remote_env_runners=lambda: len(runners),
        num_remote_worker_restarts=lambda: 0, local_env_runner=None,
        foreach_env_runner=lambda func, remote_worker_ids, **_: [
            func(runners[i]) for i in remote_worker_ids])
    algo = _algo(runner_group, learner_group)
    return WeightSync(algo), runners, calls


def test_colocated_engines_load_each_ipc_chunk_through_vllms_api(monkeypatch):
    from rllib_grpo.rllib.algorithm import weight_sync

    monkeypatch.setattr(weight_sync, "fake_gpus", lambda: False)
    sync, runners, calls = _gpu_sync("ipc", {1: ("GPU-A",), 2: ("GPU-B",)})
    for _ in range(2):
        sync.sync()
    assert sync.transport_names() == {1: "ipc", 2: "ipc"}
    for index in (1, 2):
        made = [(m, k) for i, m, k in calls if i == index]
        chunk = [{"update_info": {"names": [f"chunk{k}"], "dtype_names": ["bfloat16"],
                                  "shapes": [[50, 16]], "ipc_handles": {"GPU-A": k, "GPU-B": k},
                                  "tensor_sizes": [1600]}} for k in (1, 2)]
        one_sync = [("start_weight_update", None), ("update_weights", chunk[0]),
                    ("update_weights", chunk[1]), ("finish_weight_update", None),
                    ("reset_prefix_cache", None)]
        assert made == [("shutdown_weight_transfer_engine", None),  # joined once
                        ("init_weight_transfer_engine", {"init_info": {"packed": True}}),
                        *one_sync, *one_sync]
        assert runners[index].received == [(3200.0, 4), (3200.0, 4)]


def test_separate_engines_join_one_nccl_group_and_receive_while_learner_0_sends(monkeypatch):
    from rllib_grpo.rllib.algorithm import weight_sync

    monkeypatch.setattr(weight_sync, "fake_gpus", lambda: False)
    sync, runners, calls = _gpu_sync("nccl", {1: ("GPU-C", "GPU-D"), 2: ("GPU-E",)})
    sync.sync()
    sync.sync()
    assert sync.transport_names() == {1: "nccl", 2: "nccl"}
    assert [c for c in calls if c[0] == "learner join"] == [
        ("learner join", 0, ("uid", 4)), ("learner join", 1, ("uid", 4))]  # one group, once
    assert [c for c in calls if c[0] == "learner send"] == [
        ("learner send", 0, None), ("learner send", 1, None)] * 2
    inits = {i: k["init_info"] for i, m, k in calls if m == "init_weight_transfer_engine"}
    assert {i: (info["rank_offset"], info["world_size"], info["nccl_unique_id_b64"])
            for i, info in inits.items()} == {1: (1, 4, "uid"), 2: (3, 4, "uid")}
    update = {"names": ["model.embed_tokens.weight", "lm_head.weight"],
              "dtype_names": ["bfloat16", "bfloat16"], "shapes": [[50, 16], [50, 16]]}
    assert [(m, k) for i, m, k in calls if i == 2][2:6] == [
        ("start_weight_update", None), ("update_weights", {"update_info": update}),
        ("finish_weight_update", None), ("reset_prefix_cache", None)]


def test_an_engine_started_for_another_backend_than_its_placement_needs_is_refused(monkeypatch):
    from rllib_grpo.rllib.algorithm import weight_sync

    monkeypatch.setattr(weight_sync, "fake_gpus", lambda: False)
    sync, _, _ = _gpu_sync("nccl", {1: ("GPU-A",)})  # on a learner's GPU: ipc
    with pytest.raises(RuntimeError, match="env runner 1's vLLM engine was started for nccl "
                                           "weight transfers, but .* need ipc"):
        sync.sync()


@pytest.mark.slow
def test_fsdp_learners_gather_every_tensor_for_the_shared_file(ray_session):
    """Two FSDP2 learners (Ray Train workers), a remote env runner: every tensor is gathered
    from the shards on both learners, in the same order, and written by rank 0."""
    config = tiny_config()
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
        algo._sync_weights()
        assert algo._weight_sync.transport_names() == {1: "shm"}
        (state,) = _remote_sampler_states(algo)
        _assert_equal(state, moved)
    finally:
        algo.stop()


@pytest.mark.slow
def test_remote_learner_reaches_the_drivers_env_runner_through_the_object_store(ray_session):
    """``num_learners=1``: the learner is an actor and the env runner lives in the driver:
    Ray's object store."""
    config = tiny_config(lr=1e-2)
    config.learners(num_learners=1, num_cpus_per_learner=1)
    config.resources(num_cpus_for_main_process=0)
    algo = config.build_algo()
    try:
        for _ in range(2):
            algo.train()
            _assert_equal(algo.env_runner.sampler.model.state_dict(), _learner_state(algo))
        assert algo._weight_sync.transport_names() == {0: "object_store"}
    finally:
        algo.stop()


def _never_joins(*_args, **_kwargs) -> None:
    time.sleep(3600)  # a rendezvous whose other members cannot reach the bootstrap port


def test_an_nccl_group_that_cannot_form_stops_within_the_connect_timeout_naming_the_port(
        monkeypatch, tmp_path):
    """The rendezvous has ``weight_sync_connect_timeout_s``, not the step's floor (an hour),
    and its one line says where learner 0's bootstrap listens and what to open."""
    import uuid

    from rllib_grpo.rllib.algorithm import weight_sync
    from rllib_grpo.rllib.algorithm.deadlines import Deadlines, HangError
    from rllib_grpo.rllib.algorithm.resilience import ResilientAlgorithm

    monkeypatch.setattr(weight_sync, "fake_gpus", lambda: False)
    sync, _, _ = _gpu_sync("nccl", {1: ("GPU-C",)})
    address = socket.inet_aton("10.0.0.7")
    unique_id = base64.b64encode(bytes(8) + (socket.AF_INET).to_bytes(2, "little")
                                 + (29500).to_bytes(2, "big") + address + bytes(112)).decode()
    monkeypatch.setattr(_Sender, "nccl_unique_id",
                        lambda self: unique_id if self.rank == 0 else None)
    monkeypatch.setattr(_Sender, "nccl_join", _never_joins)
    algo = sync.algo
    algo.config.weight_sync_connect_timeout_s = 1.0
    algo.deadlines = Deadlines(uuid.uuid4().hex[:12], factor=3.0, floor_s=3600.0,
                               folder=lambda: tmp_path)
    algo.learner_group.group.is_local = True  # the learners' wait runs in this process
    algo.waiting_on_learners = lambda *args, **kwargs: ResilientAlgorithm.waiting_on_learners(
        algo, *args, **kwargs)
    start = time.monotonic()
    try:
        with pytest.raises(HangError) as error:
            sync.sync()
    finally:
        algo.deadlines.close()
        sync.close()
    assert time.monotonic() - start < 20
    message = str(error.value)
    assert "\n" not in message
    assert ("did not finish within 1.0 s (weight_sync_connect_timeout_s: the NCCL group forms "
            "through learner 0's bootstrap at 10.0.0.7:29500; open TCP from the engines' nodes "
            "to that port") in message, message
