"""A learner connecting a weight engine (`WeightSender.connect`), on CPU: the rendezvous
port the runners are told is one the learner holds already, and a group that does not
form within the timeout fails in one line naming the runners, the address and the port to
open.  vLLM's NCCL communicator needs a GPU: here NCCL's library is absent, so both sides
get vLLM's disabled communicator once the rendezvous (a TCP store) has formed."""

from __future__ import annotations

import socket
import threading
import time
from types import SimpleNamespace

import pytest
import ray
import torch
from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.rllib.algorithm import weight_client
from rllib_grpo.rllib.algorithm.weight_client import EnvRunnerClient
from rllib_grpo.rllib.learner import weight_sender
from rllib_grpo.rllib.learner.weight_sender import WeightSender

HOST = "127.0.0.1"


@pytest.fixture
def sender(monkeypatch):
    """A learner's `WeightSender` on this machine's loopback; vLLM's NCCL code asks for the
    accelerator's device index, which a CPU has not: device 0 (never used, see above)."""
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: HOST)
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    import rllib_grpo.weights.engines  # noqa: F401  (vLLM's import is not the connect's time)

    lm = torch.nn.Linear(2, 2)
    learner = SimpleNamespace(module={DEFAULT_MODULE_ID: SimpleNamespace(lm=lm, lora=None)})
    weights = WeightSender(learner)
    yield weights
    weights.close()


def _finishes(seconds: float, func, *args, **kwargs):
    """``func(*args, **kwargs)`` on a thread; its result or error, or a test failure if it
    is still running after ``seconds`` (a connect that waits is what is tested)."""
    outcome: dict = {}

    def run():
        try:
            outcome["result"] = func(*args, **kwargs)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        pytest.fail(f"still waiting after {seconds} s")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class _Handle:
    """An env runner actor handle whose calls record what they were asked."""

    def __init__(self, calls: list):
        self.apply = SimpleNamespace(remote=lambda func, **kwargs: calls.append(kwargs))


@pytest.mark.parametrize("backend, group", [("nccl", "NCCL"), ("grpo_gloo", "gloo")])
def test_a_runner_that_never_joins_fails_the_connect_in_one_line_within_the_timeout(
        sender, monkeypatch, backend, group):
    """Regression: the NCCL rendezvous waited in vLLM's store for 300 s whatever the
    setting (and then in ``ncclCommInitRank`` for ever); the gloo one said neither who nor
    what to open."""
    calls: list = []
    released = threading.Event()
    monkeypatch.setattr(weight_client.ray, "get", lambda refs: released.wait())  # never joins
    client = EnvRunnerClient(backend, {3: _Handle(calls)}, {3: 1}, token="t",
                             nodes={3: "10.0.0.5"})
    start = time.monotonic()
    try:
        with pytest.raises(TimeoutError) as failed:
            _finishes(30, sender.connect, backend, 2, client, timeout_s=2)
    finally:
        released.set()
    elapsed = time.monotonic() - start
    told = calls[0]["init_info"]["init_info"]  # what the runner was to join
    port = told.get("master_port") or told["port"]
    assert str(failed.value) == (
        f"weight sync: env runner 3 (node 10.0.0.5) did not join the {group} group at "
        f"{HOST}:{port} within 2 s: open TCP port {port} (and {group}'s ports) between the "
        f"nodes, or set weight_sync_transport='object_store'")
    assert 2 <= elapsed < 5  # the timeout, connect's grace of 1 s for a precise error, slack


class _JoinsAsVllmWorker:
    """A client whose one runner joins as a vLLM worker does (vLLM's own
    ``worker_init_process_group``), at the address it is told."""

    def __init__(self):
        self.joined: list[tuple[str, int]] = []
        self.groups: list = []

    def init_weight_transfer_engine(self, payload: dict) -> None:
        from vllm.distributed.weight_transfer.nccl_common import (
            NCCLWeightTransferInitInfo,
            worker_init_process_group,
        )

        info = NCCLWeightTransferInitInfo(**payload)
        self.groups.append(worker_init_process_group(
            info, SimpleNamespace(data_parallel_index=0, world_size=1, rank=0)))
        self.joined.append((info.master_address, info.master_port))


def test_the_port_the_runners_are_told_is_held_before_they_are_told(sender, monkeypatch):
    """Regression: the port was found free, closed, and bound again by vLLM's store, so
    another process could take it in between (a hang or an address-in-use error for the
    run).  Here one tries right after the port is chosen: it cannot, and the runner joins
    the group where it was told."""
    chosen, contested = weight_sender.vllm_trainer_init, []
    told_port = None

    def chosen_then_contested(*args, **kwargs):
        nonlocal told_port
        init_info = chosen(*args, **kwargs)
        told_port = init_info.master_port
        other = socket.socket()
        try:
            other.bind((init_info.master_address, init_info.master_port))
            other.listen()
            contested.append(other)  # another process got the port
        except OSError:
            other.close()
        return init_info

    monkeypatch.setattr(weight_sender, "vllm_trainer_init", chosen_then_contested)
    client = _JoinsAsVllmWorker()
    try:
        _finishes(30, sender.connect, "nccl", 2, client, timeout_s=10)
    finally:
        for other in contested:
            other.close()
    assert contested == []
    assert client.joined == [(HOST, told_port)]
    assert sender.engines["nccl"].model_update_group is not None  # the group formed
