"""The host path of weight syncs without Ray: the manifest (tied weights stored once, the
wire dtype), one shared-memory file written by the learner and read by receivers in other
processes, and the stamps that make a torn or stale read an error."""

from __future__ import annotations

import errno
import multiprocessing
import os

import pytest
import torch

from rllib_grpo.weights import shm
from rllib_grpo.weights.shm import ALIGN_BYTES, SharedWeights, plan_manifest, split_aliases


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    embed = torch.randn(50, 16, generator=g)
    return {
        "model.embed_tokens.weight": embed,
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(32, 16, generator=g).t(),  # strided
        "model.norm.weight": torch.randn(16, generator=g),
        "model.steps": torch.arange(3),  # an integer buffer keeps its dtype
        "lm_head.weight": embed,  # tied
    }


def test_tied_weights_are_stored_once_and_read_under_both_names():
    unique, aliases = split_aliases(_state())
    assert aliases == (("lm_head.weight", "model.embed_tokens.weight"),)
    assert "lm_head.weight" not in unique
    manifest = plan_manifest(unique, aliases=aliases)
    assert manifest.names() == set(_state())
    assert all(e.offset % ALIGN_BYTES == 0 for e in manifest.entries)
    shared = SharedWeights.create(manifest.nbytes)
    try:
        shared.write(manifest, unique.__getitem__, stamp=1)
        views = shared.read(manifest, stamp=1)
        for name, tensor in _state().items():
            assert torch.equal(views[name], tensor), name  # fp32: bit-exact
        assert views["lm_head.weight"].data_ptr() == views["model.embed_tokens.weight"].data_ptr()
    finally:
        shared.close(remove=True)
    assert not os.path.exists(shared.path)


def test_floating_tensors_travel_in_the_wire_dtype_others_in_theirs():
    unique, _ = split_aliases(_state())
    manifest = plan_manifest(unique, wire_dtype=torch.bfloat16)
    shared = SharedWeights.create(manifest.nbytes)
    try:
        shared.write(manifest, unique.__getitem__, stamp=1)
        views = shared.read(manifest, stamp=1)
        norm = unique["model.norm.weight"]
        assert views["model.norm.weight"].dtype == torch.bfloat16
        assert torch.equal(views["model.norm.weight"], norm.to(torch.bfloat16))  # the cast: RNE
        assert torch.equal(views["model.steps"], unique["model.steps"])
        assert manifest.nbytes < sum(t.numel() * 4 for t in unique.values())
    finally:
        shared.close(remove=True)


def _read_in_a_process(path: str, manifest, stamp: int, queue) -> None:
    reader = SharedWeights.open(path, manifest.nbytes)
    queue.put({k: v.numpy().copy() for k, v in reader.read(manifest, stamp).items()})
    reader.check_unchanged(stamp)
    reader.close()


def test_a_receiver_in_another_process_reads_what_the_learner_wrote():
    unique, aliases = split_aliases(_state(3))
    manifest = plan_manifest(unique, aliases=aliases)
    shared = SharedWeights.create(manifest.nbytes)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    try:
        for stamp, seed in ((1, 3), (2, 4)):  # the same file, written again
            unique, _ = split_aliases(_state(seed))
            shared.write(manifest, unique.__getitem__, stamp)
            process = context.Process(target=_read_in_a_process,
                                      args=(shared.path, manifest, stamp, queue))
            process.start()
            received = queue.get(timeout=60)
            process.join(timeout=60)
            assert process.exitcode == 0
            for name, tensor in _state(seed).items():
                assert torch.equal(torch.from_numpy(received[name]), tensor), name
    finally:
        shared.close(remove=True)


def test_a_stale_or_torn_read_is_an_error_not_garbage():
    unique, _ = split_aliases(_state())
    manifest = plan_manifest(unique)
    shared = SharedWeights.create(manifest.nbytes)
    reader = SharedWeights.open(shared.path, manifest.nbytes)
    try:
        shared.write(manifest, unique.__getitem__, stamp=1)
        with pytest.raises(RuntimeError, match="holds sync 1 .* not sync 2"):
            reader.read(manifest, stamp=2)
        reader.read(manifest, stamp=1)
        shared.write(manifest, unique.__getitem__, stamp=2)  # while the reader "loads"
        with pytest.raises(RuntimeError, match="began writing sync 2 .* while sync 1 was being "
                                               "loaded .* torn"):
            reader.check_unchanged(stamp=1)
    finally:
        reader.close()
        shared.close(remove=True)


def test_files_of_dead_writers_are_removed_and_a_full_folder_is_named(monkeypatch, tmp_path):
    monkeypatch.setattr(shm, "shm_folder", lambda: str(tmp_path))
    dead = tmp_path / f"{shm.FILE_PREFIX}999999999_abc"  # no such pid
    alive = tmp_path / f"{shm.FILE_PREFIX}{os.getpid()}_abc"
    other = tmp_path / "someone_elses_file"
    for path in (dead, alive, other):
        path.write_bytes(b"x")
    shared = SharedWeights.create(1024)
    assert not dead.exists() and alive.exists() and other.exists()
    shared.close(remove=True)

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full)
    with pytest.raises(OSError, match=rf"{tmp_path} has \d+ MiB free but the weights need "
                                      r"2048 MiB: enlarge it .*--shm-size.*'object_store'"):
        SharedWeights.create(2**31)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])
