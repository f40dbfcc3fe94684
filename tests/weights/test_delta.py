"""Delta syncs' trainer side (`rllib_grpo.weights.delta.DeltaTracker`) and the wire bytes
(`rllib_grpo.weights.wire.update_nbytes`): a tensor travels as (int32 index, value) pairs
only while that is fewer bytes than the tensor itself; applied on a host copy, a delta
gives the full sync's tensors bit for bit."""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.weights.delta import DeltaTracker, patch_nbytes, sparse_pays
from rllib_grpo.weights.layout import plan_manifest
from rllib_grpo.weights.trainer import ManifestSource
from rllib_grpo.weights.wire import Patch, SparseUpdate, apply_patch, as_dict, update_nbytes


def _source(tensors: dict[str, torch.Tensor], wire_dtype=None) -> ManifestSource:
    return ManifestSource(plan_manifest(tensors, wire_dtype=wire_dtype), tensors.__getitem__)


def _wire(patches) -> dict:
    """The update info `SparseGlooTrainerEngine` builds for ``patches``."""
    return as_dict(SparseUpdate([p.name for p in patches],
                                [str(p.values.dtype).split(".")[-1] for p in patches],
                                [list(p.full_shape) for p in patches],
                                [p.values.numel() for p in patches]))


def _apply(held: dict[str, torch.Tensor], patches) -> None:
    """What the receiver does (`HostReceiver.patches` then `apply_patch`)."""
    for p in patches:
        n = p.values.numel()
        patch = Patch(p.name, p.full_shape, p.values.dtype, p.values.clone(),
                      None if n == p.values.new_empty(p.full_shape).numel() else p.indices)
        if p.name not in held:
            held[p.name] = torch.empty(p.full_shape, dtype=p.values.dtype)
        apply_patch(held[p.name], patch)


@pytest.mark.parametrize("dtype, index_bytes_per_value", [(torch.float32, 1.0),
                                                          (torch.bfloat16, 2.0)])
def test_the_dense_threshold_follows_the_dtype_sizes(dtype, index_bytes_per_value):
    """value / (index + value): fp32 1/2, bf16 1/3, at equality the sparse form."""
    size = torch.empty((), dtype=dtype).element_size()
    numel = 1200
    at = int(numel * size / (4 + size))
    assert sparse_pays(at, numel, size)
    assert not sparse_pays(at + 1, numel, size)
    assert not sparse_pays(numel, numel, size)
    assert 4 / size == index_bytes_per_value


def test_a_fully_changed_tensor_never_costs_more_than_a_full_sync():
    generator = torch.Generator().manual_seed(0)
    tensors = {"a.weight": torch.randn(64, 32, generator=generator),
               "b.weight": torch.randn(300, generator=generator),
               "c.bias": torch.randn(7, generator=generator)}
    source = _source(tensors)
    tracker = DeltaTracker()
    first, changed, total = tracker.patches(source)  # the first after a join: all whole
    assert changed == total and all(p.dense for p in first)
    full_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    assert full_bytes <= source.manifest.nbytes  # the buckets may pad
    assert sum(patch_nbytes(p) for p in first) == update_nbytes(_wire(first)) == full_bytes
    held: dict[str, torch.Tensor] = {}
    _apply(held, first)
    with torch.no_grad():
        tensors["a.weight"].add_(1.0)                  # every element: whole
        tensors["b.weight"][:150].add_(1.0)            # exactly half: sparse (equal bytes)
        tensors["c.bias"][3] = -tensors["c.bias"][3]   # one element: sparse
    patches, changed, total = tracker.patches(source)
    kinds = {p.name: p.dense for p in patches}
    assert kinds == {"a.weight": True, "b.weight": False, "c.bias": False}
    assert changed == 64 * 32 + 150 + 1
    sent = update_nbytes(_wire(patches))
    assert sent == sum(patch_nbytes(p) for p in patches) == (64 * 32 + 150 * 2 + 2) * 4
    assert sent <= full_bytes
    _apply(held, patches)
    for name, tensor in tensors.items():  # what a full sync would leave: bit for bit
        assert torch.equal(held[name].view(torch.int32), tensor.view(torch.int32)), name


def test_one_adamw_step_as_a_delta_equals_a_full_sync_for_no_more_bytes():
    """AdamW (as the learner steps) changes nearly every fp32 element: the delta sends
    those tensors whole, never more than the full sync's bytes, and the receiver's copy is
    the full sync's bit for bit (signed zeros included)."""
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
    tensors = {k: v.detach() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model[0].bias[0] = 0.0
    source = _source(tensors)
    tracker, held = DeltaTracker(), {}
    _apply(held, tracker.patches(source)[0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    model(torch.randn(8, 16)).square().mean().backward()
    optimizer.step()
    patches, changed, total = tracker.patches(source)
    assert changed > total / 2
    assert update_nbytes(_wire(patches)) <= source.manifest.nbytes
    _apply(held, patches)
    for name, tensor in tensors.items():
        assert torch.equal(held[name].view(torch.int32), tensor.view(torch.int32)), name


def test_a_bf16_wire_delta_counts_bits_of_the_cast():
    """With a bf16 wire, only elements whose bf16 bits changed travel."""
    tensors = {"w": torch.ones(90)}
    source = _source(tensors, wire_dtype=torch.bfloat16)
    tracker = DeltaTracker()
    tracker.patches(source)
    with torch.no_grad():
        tensors["w"][:10] += 1e-6   # below bf16's resolution at 1.0: no change on the wire
        tensors["w"][10:20] += 0.5  # 10 of 90 < 1/3: sparse
    patches, changed, _ = tracker.patches(source)
    assert changed == 10 and not patches[0].dense
    assert patch_nbytes(patches[0]) == 10 * (4 + 2)
