"""Delta syncs' trainer side: `DeltaTracker` holds what the receivers hold (the last sync,
in the wire dtype) and computes the patches that bring them to the current weights, as
vLLM's sparse patches (`SparsePatch`: int32 flat indices and values) or a tensor whole
where that is fewer bytes (`sparse_pays`).  `rllib_grpo.weights.trainer`'s
``SparseGlooTrainerEngine`` sends them; ``SparseGlooEngine`` (`rllib_grpo.weights.engines`)
or a transformers sampler applies them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from rllib_grpo.weights.layout import Manifest


class WeightsSource(Protocol):
    """What `DeltaTracker` reads (`rllib_grpo.weights.trainer.ManifestSource`): the layout
    and each tensor by name."""

    manifest: Manifest

    def tensor(self, name: str) -> torch.Tensor: ...


@dataclass
class SparsePatch:
    """vLLM's ``SparseWeightPatch`` fields: flat int32 ``indices`` and their ``values``;
    ``dense``: ``values`` is the whole flat tensor and no indices travel."""

    name: str
    indices: torch.Tensor
    values: torch.Tensor
    full_shape: tuple[int, ...]
    dense: bool = False

    @classmethod
    def whole(cls, name: str, flat: torch.Tensor, shape: tuple[int, ...]) -> SparsePatch:
        return cls(name, torch.empty(0, dtype=torch.int32), flat, shape, dense=True)


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
INDEX_BYTES = 4  # int32 flat indices, as vLLM's sparse patches


def _bits(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1).view(_BITS[tensor.element_size()])


def sparse_pays(changed: int, numel: int, value_bytes: int) -> bool:
    """Whether ``changed`` of ``numel`` elements travel in fewer bytes as (index, value)
    pairs than the whole tensor does: ``changed / numel < value / (index + value)`` (fp32:
    under half, bf16: under a third).  At equality the sparse form is kept."""
    return changed * (INDEX_BYTES + value_bytes) <= numel * value_bytes and changed < numel


def patch_nbytes(patch: SparsePatch) -> int:
    """Bytes one patch puts on the wire: values only when dense (no indices)."""
    values = patch.values.numel() * patch.values.element_size()
    return values if patch.dense else values + patch.indices.numel() * INDEX_BYTES


class DeltaTracker:
    """What the receivers hold (the last sync, in the wire dtype, on the learner's device)
    and the patches that bring them to the current weights: every element whose *bits*
    changed (so -0.0 vs 0.0 counts; lossless), as int32 flat indices and values, or the
    whole tensor where that is fewer bytes (`sparse_pays`).  The first sync after a
    (re)join sends every tensor whole."""

    def __init__(self) -> None:
        self.baseline: dict[str, torch.Tensor] = {}

    def patches(self, source: WeightsSource) -> tuple[list[SparsePatch], int, int]:
        """``(patches, changed elements, all elements)``; the baseline moves to the source."""
        patches, changed, total = [], 0, 0
        for bucket in source.manifest.buckets:
            for entry in bucket.entries:
                new = source.tensor(entry.name).detach()
                new = new.to(bucket.dtype) if new.dtype != bucket.dtype else new.clone()
                old = self.baseline.get(entry.name)
                flat = new.reshape(-1)
                total += flat.numel()
                self.baseline[entry.name] = new
                if old is None or old.shape != new.shape or old.dtype != new.dtype:
                    patches.append(SparsePatch.whole(entry.name, flat, entry.shape))
                    changed += flat.numel()
                    continue
                index = (_bits(old) != _bits(new)).nonzero().reshape(-1)
                if not index.numel():
                    continue
                changed += index.numel()
                if sparse_pays(index.numel(), flat.numel(), flat.element_size()):
                    _check_indexable(entry.name, flat)
                    index = index.to(torch.int32)
                    patches.append(SparsePatch(entry.name, index, flat[index], entry.shape))
                else:
                    patches.append(SparsePatch.whole(entry.name, flat, entry.shape))
        return patches, changed, total

    def reset(self) -> None:
        self.baseline = {}


def _check_indexable(name: str, flat: torch.Tensor) -> None:
    if flat.numel() >= 2**31:
        raise ValueError(f"delta sync: {name} has {flat.numel()} elements; sparse patches "
                         "index with int32. Use weight_sync_transport='auto'.")
