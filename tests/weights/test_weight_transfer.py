"""Weight transfer without Ray: bucket layout, packing, tied weights, and the collective and
shared-memory paths between threads of one process (each thread a rank of a gloo group)."""

from __future__ import annotations

import threading

import pytest
import torch

from rllib_grpo.models import load_causal_lm, resolve_model
from rllib_grpo.weights.layout import (
    ALIGN_BYTES,
    fused_unit,
    pack_all,
    pack_bucket,
    plan_manifest,
    split_aliases,
    unpack_all,
)
from rllib_grpo.weights.transport import BucketReceiver, BucketSender, WeightGroup, open_store


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(50, 16, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(8, 16, generator=g),
        "model.layers.0.self_attn.v_proj.weight": torch.randn(8, 16, generator=g),
        "model.layers.0.self_attn.q_proj.bias": torch.randn(16, generator=g),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(32, 16, generator=g).t(),  # strided
        "model.layers.0.mlp.up_proj.weight": torch.randn(16, 32, generator=g),
        "model.norm.weight": torch.randn(16, generator=g),
        "model.steps": torch.arange(3),  # an integer buffer keeps its dtype
        "lm_head.weight": embed,  # tied
    }


def test_tied_weights_travel_once_and_come_back_under_both_names():
    unique, aliases = split_aliases(_state())
    assert aliases == (("lm_head.weight", "model.embed_tokens.weight"),)
    assert "lm_head.weight" not in unique
    manifest = plan_manifest(unique, aliases=aliases, bucket_bytes=2048)
    assert manifest.names() == set(_state())
    out = unpack_all(manifest, pack_all(manifest, unique))
    for name, tensor in _state().items():
        assert torch.equal(out[name], tensor), name  # fp32: bit-exact
    assert out["lm_head.weight"].data_ptr() == out["model.embed_tokens.weight"].data_ptr()


def test_buckets_respect_the_size_keep_units_whole_and_hold_one_dtype():
    unique, aliases = split_aliases(_state())
    bucket_bytes = 3000
    manifest = plan_manifest(unique, aliases=aliases, bucket_bytes=bucket_bytes)
    assert len(manifest.buckets) > 2
    unit_bucket: dict[str, int] = {}
    for i, bucket in enumerate(manifest.buckets):
        assert bucket.nbytes <= bucket_bytes or len({fused_unit(e.name) for e in bucket.entries}) == 1
        for e in bucket.entries:
            itemsize = torch.empty((), dtype=bucket.dtype).element_size()
            assert e.offset * itemsize % ALIGN_BYTES == 0
            assert unit_bucket.setdefault(fused_unit(e.name), i) == i  # q/k/v together
    dtypes = {e.name: b.dtype for b in manifest.buckets for e in b.entries}
    assert dtypes["model.steps"] == torch.int64 and dtypes["model.norm.weight"] == torch.float32
    assert fused_unit("model.layers.0.self_attn.k_proj.weight") == fused_unit(
        "model.layers.0.self_attn.q_proj.bias")
    assert fused_unit("model.layers.0.mlp.up_proj.weight") != fused_unit(
        "model.layers.0.mlp.down_proj.weight")


def test_floating_tensors_travel_in_the_wire_dtype():
    unique, _ = split_aliases(_state())
    manifest = plan_manifest(unique, wire_dtype=torch.bfloat16, bucket_bytes=1 << 20)
    out = unpack_all(manifest, pack_all(manifest, unique))
    assert out["model.norm.weight"].dtype == torch.bfloat16
    assert torch.equal(out["model.norm.weight"], unique["model.norm.weight"].to(torch.bfloat16))
    assert torch.equal(out["model.steps"], unique["model.steps"])
    assert manifest.nbytes < sum(t.numel() * 4 for t in unique.values())


def _run_ranks(world: int, body) -> list:
    """Run ``body(rank, spec, store)`` in one thread per rank; re-raise the first error."""
    store, spec = open_store("127.0.0.1", world, "gloo", timeout_s=60)
    results, errors = [None] * world, []

    def run(rank):
        try:
            results[rank] = body(rank, spec, store if rank == 0 else None)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    return results


@pytest.mark.parametrize("via", ["collective", "shm"])
def test_streamed_buckets_equal_the_senders_tensors(via):
    """Three receivers, buckets smaller than the model: every tensor arrives exactly."""
    state = _state(1)
    unique, aliases = split_aliases(state)
    # Contiguous tensors of >= 1 KiB are sent from where they lie (collective), the rest packed.
    manifest = plan_manifest(unique, aliases=aliases, bucket_bytes=1500, direct_min_bytes=1024)
    assert len(manifest.buckets) >= 3  # the two buffers / slots are reused
    direct = {e.name for b in manifest.buckets for e in b.direct}
    assert "model.layers.0.self_attn.q_proj.weight" in direct
    assert "model.layers.0.mlp.gate_proj.weight" not in direct  # strided: packed
    assert any(b.packed and b.direct for b in manifest.buckets)
    sender = BucketSender()
    slots = sender.ensure_slots(manifest.max_bucket_bytes) if via == "shm" else None

    def body(rank, spec, store):
        if rank == 0:
            sender.group = WeightGroup(spec, 0, store)
            sender.send(manifest, unique.__getitem__, via)
            return None
        receiver = BucketReceiver()
        receiver.join(spec, rank)
        if slots is not None:
            receiver.map_slots(slots)
        got = dict(receiver.stream(manifest, via))  # kept views: set apart before reuse
        receiver.close()
        return got

    results = _run_ranks(4, body)
    sender.close()
    for got in results[1:]:
        assert set(got) == set(state)
        for name, tensor in state.items():
            assert torch.equal(got[name], tensor), name


def test_the_shm_sender_packs_with_one_thread_and_gives_its_threads_back(monkeypatch):
    """The receivers copy bucket k while the sender packs bucket k+1: on a 2-core machine
    two packing threads made their copies 2-3x slower.  The count is the sending thread's
    own (torch's OpenMP and MKL settings are per thread), and it comes back."""
    from rllib_grpo.weights import transport

    threads_while_packing = []

    def pack(*args, **kwargs):
        threads_while_packing.append(torch.get_num_threads())
        return pack_bucket(*args, **kwargs)

    monkeypatch.setattr(transport, "pack_bucket", pack)
    unique, aliases = split_aliases(_state(2))
    manifest = plan_manifest(unique, aliases=aliases, bucket_bytes=1500)
    sender = BucketSender()
    slots = sender.ensure_slots(manifest.max_bucket_bytes)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        def body(rank, spec, store):
            if rank == 0:
                sender.group = WeightGroup(spec, 0, store)
                sender.send(manifest, unique.__getitem__, "shm")
                return torch.get_num_threads()
            receiver = BucketReceiver()
            receiver.join(spec, rank)
            receiver.map_slots(slots)
            got = {name: tensor.clone() for name, tensor in receiver.stream(manifest, "shm")}
            receiver.close()
            return got

        after_send, got = _run_ranks(2, body)
    finally:
        torch.set_num_threads(before)
        sender.close()
    assert threads_while_packing == [1] * len(manifest.buckets)
    assert after_send == 2
    assert all(torch.equal(got[name], tensor) for name, tensor in unique.items())


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


def test_hf_sampler_receives_into_its_live_parameters(tiny_path):
    from rllib_grpo.samplers.hf import HFSampler

    sampler = HFSampler(tiny_path)
    learner = load_causal_lm(tiny_path)
    with torch.no_grad():
        for p in learner.parameters():
            p.add_(torch.randn_like(p))
    unique, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(unique, aliases=aliases, wire_dtype=sampler.weight_dtype,
                             bucket_bytes=64 * 1024)
    sampler.prepare_weights(manifest)  # lays the parameters out like the buckets
    live = {name: p.data_ptr() for name, p in sampler.model.named_parameters()}
    homes = [(h.data_ptr(), h.data_ptr() + h.numel() * h.element_size())
             for h in sampler._homes]
    assert all(any(lo <= ptr < hi for lo, hi in homes) for ptr in live.values())

    def body(rank, spec, store):
        if rank == 0:
            BucketSender(WeightGroup(spec, 0, store)).send(manifest, unique.__getitem__,
                                                           "collective")
            return None
        sampler.join_weight_group(spec, rank)
        return sampler.receive_weights(manifest, "collective")

    stats = _run_ranks(2, body)[1]
    assert stats["bytes"] == manifest.nbytes > 0
    for name, tensor in learner.state_dict().items():
        assert torch.equal(sampler.model.state_dict()[name], tensor), name
    # Received straight into the parameters: they kept their place.
    assert {name: p.data_ptr() for name, p in sampler.model.named_parameters()} == live
    assert all(b.numel() == 0 for b in sampler._weight_receiver.buckets._buffers)  # no staging


def test_a_partial_or_foreign_manifest_is_refused_before_anything_moves(tiny_path):
    from rllib_grpo.samplers.hf import HFSampler

    sampler = HFSampler(tiny_path)
    state = load_causal_lm(tiny_path).state_dict()
    partial = {k: v for k, v in state.items() if k != "model.norm.weight"}
    with pytest.raises(KeyError, match="model.norm.weight"):
        sampler.prepare_weights(plan_manifest(partial))
    foreign = {**state, "model.extra.weight": torch.zeros(2)}
    with pytest.raises(KeyError, match="model.extra.weight"):
        sampler.prepare_weights(plan_manifest(foreign))


def test_weight_groups_are_shut_down_when_closed_or_formed_again(monkeypatch):
    """A closed sender/receiver or a receiver joining a new group shuts the old group down
    (gloo's connections), and the sender's store goes."""
    import torch.distributed as dist

    shut: list[int] = []
    monkeypatch.setattr(dist.ProcessGroupGloo, "shutdown", lambda pg: shut.append(id(pg)))
    state = _state(2)
    unique, aliases = split_aliases(state)
    manifest = plan_manifest(unique, aliases=aliases)
    receiver, sender = BucketReceiver(), BucketSender()
    groups: dict[int, list[WeightGroup]] = {0: [], 1: []}

    def body(rank, spec, store):
        if rank == 0:
            sender.close()  # as `WeightSender.open_group` does before a new group
            sender.group = WeightGroup(spec, 0, store)
            groups[0].append(sender.group)
            sender.send(manifest, unique.__getitem__, "collective")
            return None
        receiver.join(spec, rank)  # leaves the previous group first
        groups[1].append(receiver.group)
        return dict(receiver.stream(manifest, "collective"))

    _run_ranks(2, body)
    first = [groups[0][0], groups[1][0]]
    first_pgs = [id(g.pg) for g in first]
    _run_ranks(2, body)  # the group formed again
    assert all(g.pg is None and g._store is None for g in first)
    assert sorted(shut) == sorted(first_pgs)
    second_pgs = [id(groups[0][1].pg), id(groups[1][1].pg)]
    sender.close()
    receiver.close()
    assert sorted(shut) == sorted(first_pgs + second_pgs)
    with pytest.raises(RuntimeError, match="closed"):
        groups[0][1].barrier()


def test_the_sender_raises_a_clear_error_when_a_rank_never_joins():
    """Regression (a sync hung in TCPStore::doWait): rank 0 waits for the joiners on the
    store with a deadline and names the missing ranks; a join that failed raises its own
    error at once."""
    import concurrent.futures as cf
    import time

    from rllib_grpo.weights.transport import open_store, wait_for_members

    store, spec = open_store("127.0.0.1", 2, "gloo", timeout_s=0.5)
    never: cf.Future = cf.Future()  # a joiner that neither joins nor fails
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"ranks \[1\] did not join the gloo group at "
                                           rf"127.0.0.1:{spec.port} within 0.5 s"):
        wait_for_members(store, spec, never)
    assert time.monotonic() - start < 5
    failed: cf.Future = cf.Future()
    failed.set_exception(ValueError("runner refused the engine"))
    with pytest.raises(ValueError, match="runner refused"):
        wait_for_members(store, spec, failed)


def test_joiners_reach_the_store_before_the_sender_forms_the_group():
    import concurrent.futures as cf

    from rllib_grpo.weights.transport import WeightGroup, open_store, wait_for_members

    store, spec = open_store("127.0.0.1", 2, "gloo", timeout_s=30)
    with cf.ThreadPoolExecutor(1) as pool:
        joining = pool.submit(WeightGroup, spec, 1)
        wait_for_members(store, spec, joining)
        sender = WeightGroup(spec, 0, store)
        joiner = joining.result()
    sender.close()
    joiner.close()
