"""Weight transfer, the transport-independent part: a state dict cut into fixed-size flat
buckets (one dtype each) and read back, names and tied weights preserved.

A `Manifest` says what one weight sync carries: the buckets in order, each entry's name,
shape and place in its bucket, and the aliases (a tied ``lm_head.weight`` travels once, as
the tensor it shares).  Sender and receivers build nothing else from each other: the
sender packs bucket after bucket (`pack_bucket`), a receiver turns a bucket it holds back
into named views (`bucket_views`) without copying.

Floating tensors travel in the *wire* dtype (the sampler's: bf16 on GPUs), so the cast
happens once, while packing; other tensors keep theirs.  Tensors of one *unit* (a module,
or the projections vLLM fuses into one layer: q/k/v, gate/up) share a bucket, so a
receiver that buffers a layer until it is complete (vLLM's layer-wise reload) never sees
half a layer when the next bucket arrives.  A unit larger than the bucket size gets a
bucket of its own.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from rllib_grpo.weights.names import FUSED_GROUPS, module_of

DEFAULT_BUCKET_BYTES = 512 * 2**20
ALIGN_BYTES = 256  # every entry starts on this boundary: aligned views for fast copies


@dataclass(frozen=True)
class Entry:
    """One tensor in a bucket: ``numel`` elements from element ``offset`` on."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int
    direct: bool = False  # a collective sends it from the source tensor, not packed


@dataclass(frozen=True)
class Bucket:
    """A flat buffer of ``numel`` elements of ``dtype`` holding ``entries`` back to back."""

    dtype: torch.dtype
    numel: int
    entries: tuple[Entry, ...]

    @property
    def nbytes(self) -> int:
        return self.numel * _itemsize(self.dtype)

    @property
    def packed(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if not e.direct)

    @property
    def direct(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.direct)

    @property
    def packed_used(self) -> int:
        """Elements up to the end of the last packed entry: the packed part that travels
        as one piece (the padding after it does not)."""
        packed = self.packed
        return packed[-1].offset + packed[-1].numel if packed else 0


@dataclass(frozen=True)
class Manifest:
    """What one sync carries: buckets in sending order and ``(alias, tensor it shares)``
    pairs.  ``partial`` marks a subset of the model (LoRA's merged layers); ``meta`` holds
    small extras the receiver needs to rebuild a payload (LoRA's kind and scaling)."""

    buckets: tuple[Bucket, ...]
    aliases: tuple[tuple[str, str], ...] = ()
    partial: bool = False
    meta: tuple[tuple[str, Any], ...] = field(default=())

    def names(self) -> set[str]:
        """Every name a receiver gets, aliases included."""
        return {e.name for b in self.buckets for e in b.entries} | {a for a, _ in self.aliases}

    @property
    def nbytes(self) -> int:
        """Bytes on the wire for one receiver (aliases are not sent)."""
        return sum(b.nbytes for b in self.buckets)

    @property
    def max_bucket_bytes(self) -> int:
        return max((b.nbytes for b in self.buckets), default=0)

    def aliases_of(self) -> dict[str, list[str]]:
        """Tensor name -> the names that share it."""
        out: dict[str, list[str]] = {}
        for alias, target in self.aliases:
            out.setdefault(target, []).append(alias)
        return out

    @functools.cached_property
    def fingerprint(self) -> str:
        """Equal for manifests with the same layout: receivers prepare once per layout."""
        return hashlib.sha1(repr((self.buckets, self.aliases, self.partial)).encode()).hexdigest()


@functools.cache
def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def wire_nbytes(tensors: Mapping[str, Any], wire_dtype: torch.dtype | None) -> int:
    """Bytes of ``tensors`` in their wire dtypes."""
    return sum(_numel(t.shape) * _itemsize(wire_dtype_of(t.dtype, wire_dtype))
               for t in tensors.values())


def fused_unit(name: str) -> str:
    """The layer a tensor loads into on the sampler side: its module, with vLLM's fused
    siblings (``q_proj``/``k_proj``/``v_proj``, ``gate_proj``/``up_proj``) as one unit."""
    module = module_of(name)
    parent, _, leaf = module.rpartition(".")
    for index, group in enumerate(FUSED_GROUPS):
        if leaf in group:
            return f"{parent}.<fused{index}>"
    return module


def _storage_key(tensor: torch.Tensor) -> tuple | None:
    """What makes two state-dict entries the same tensor (``state_dict()`` detaches each
    key separately, so identity does not tell tied weights apart)."""
    local = getattr(tensor, "_local_tensor", tensor)  # a DTensor: its shard's storage
    if local.numel() == 0 or local.device.type == "meta":
        return None
    return (local.device, local.untyped_storage().data_ptr(), local.storage_offset(),
            tuple(local.shape), tuple(local.stride()), local.dtype, id(type(tensor)))


def split_aliases(state: Mapping[str, torch.Tensor]
                  ) -> tuple[dict[str, torch.Tensor], tuple[tuple[str, str], ...]]:
    """The distinct tensors of ``state`` (first name wins) and ``(alias, that name)`` pairs
    for the entries that share one (tied embeddings)."""
    first: dict[tuple, str] = {}
    unique: dict[str, torch.Tensor] = {}
    aliases = []
    for name, tensor in state.items():
        key = _storage_key(tensor)
        if key is not None and key in first:
            aliases.append((name, first[key]))
            continue
        if key is not None:
            first[key] = name
        unique[name] = tensor
    return unique, tuple(aliases)


def pipelined_bucket_bytes(total_bytes: int, cap: int, min_buckets: int = 4,
                           floor: int = 16 * 2**20) -> int:
    """A bucket size of at most ``cap`` that cuts a sync into >= ``min_buckets`` buckets
    (not below ``floor``), so packing, sending and loading overlap."""
    return max(1, min(cap, max(-(-total_bytes // min_buckets), floor)))


def wire_dtype_of(dtype: torch.dtype, wire_dtype: torch.dtype | None) -> torch.dtype:
    """Floating tensors travel in ``wire_dtype`` (None: their own); others keep theirs."""
    return wire_dtype if wire_dtype is not None and dtype.is_floating_point else dtype


def _aligned(numel: int, itemsize: int) -> int:
    step = max(1, ALIGN_BYTES // itemsize)
    return -(-numel // step) * step


def plan_manifest(
    tensors: Mapping[str, Any],
    *,
    wire_dtype: torch.dtype | None = None,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    aliases: tuple[tuple[str, str], ...] = (),
    unit_of: Callable[[str], str] = fused_unit,
    partial: bool = False,
    meta: Mapping[str, Any] | None = None,
    direct_min_bytes: int | None = None,
) -> Manifest:
    """Lay distinct tensors (anything with ``shape`` and ``dtype``: tensors, DTensors, meta
    tensors) out in buckets of at most ``bucket_bytes``, one dtype per bucket, whole units
    per bucket, in the order of ``tensors``.

    With ``direct_min_bytes``, a contiguous tensor of at least that size that needs no
    cast is marked ``direct``: a collective sends it from where it lies instead of copying
    it into the bucket first.  Each bucket holds its packed entries first, then its direct
    ones, so the packed part travels in one piece.
    """
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be >= 1")
    units: dict[tuple[str, torch.dtype], list[str]] = {}
    for name, tensor in tensors.items():
        units.setdefault((unit_of(name), wire_dtype_of(tensor.dtype, wire_dtype)), []).append(name)

    buckets: list[Bucket] = []
    open_items: dict[torch.dtype, list[tuple[str, tuple[int, ...], int, bool]]] = {}
    open_numel: dict[torch.dtype, int] = {}

    def close(dtype: torch.dtype) -> None:
        items = sorted(open_items.get(dtype, ()), key=lambda item: item[3])  # packed first
        entries, offset = [], 0
        for name, shape, size, direct in items:
            entries.append(Entry(name, shape, offset, _numel(shape), direct))
            offset += size
        if entries:
            buckets.append(Bucket(dtype, offset, tuple(entries)))
        open_items[dtype], open_numel[dtype] = [], 0

    for (_, dtype), names in units.items():
        itemsize = _itemsize(dtype)
        sizes = [_aligned(_numel(tensors[n].shape), itemsize) for n in names]
        unit_numel = sum(sizes)
        if open_numel.get(dtype, 0) and (open_numel[dtype] + unit_numel) * itemsize > bucket_bytes:
            close(dtype)
        items = open_items.setdefault(dtype, [])
        for name, size in zip(names, sizes, strict=True):
            tensor = tensors[name]
            shape = tuple(int(s) for s in tensor.shape)
            direct = (direct_min_bytes is not None and tensor.dtype == dtype
                      and _numel(shape) * itemsize >= direct_min_bytes
                      and getattr(tensor, "is_contiguous", lambda: True)())
            items.append((name, shape, size, direct))
        open_numel[dtype] = open_numel.get(dtype, 0) + unit_numel
        if open_numel[dtype] * itemsize >= bucket_bytes:
            close(dtype)
    for dtype in list(open_items):
        close(dtype)
    return Manifest(tuple(buckets), tuple(aliases), partial, tuple(sorted((meta or {}).items())))


def _numel(shape: Any) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


def typed(raw: torch.Tensor, bucket: Bucket) -> torch.Tensor:
    """``bucket``'s elements in a raw byte buffer (uint8, at least ``bucket.nbytes``)."""
    return raw[: bucket.nbytes].view(bucket.dtype)


def pack_bucket(bucket: Bucket, tensor_of: Callable[[str], torch.Tensor],
                out: torch.Tensor) -> None:
    """Copy (and cast) each entry's tensor into its place in ``out`` (``bucket.dtype``)."""
    for e in bucket.entries:
        out.narrow(0, e.offset, e.numel).view(e.shape).copy_(tensor_of(e.name))


def bucket_views(bucket: Bucket, buffer: torch.Tensor,
                 aliases_of: Mapping[str, list[str]] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor]]:
    """``(name, view into buffer)`` for each entry, followed by its aliases: no copies."""
    for e in bucket.entries:
        view = buffer.narrow(0, e.offset, e.numel).view(e.shape)
        yield e.name, view
        for alias in (aliases_of or {}).get(e.name, ()):
            yield alias, view


def pack_all(manifest: Manifest, tensors: Mapping[str, torch.Tensor],
             device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Every bucket of ``manifest`` packed into a fresh buffer (tests and benchmarks)."""
    out = []
    for bucket in manifest.buckets:
        buffer = torch.empty(bucket.numel, dtype=bucket.dtype, device=device)
        pack_bucket(bucket, tensors.__getitem__, buffer)
        out.append(buffer)
    return out


def unpack_all(manifest: Manifest, buffers: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Named views of packed buffers, aliases included (the inverse of `pack_all`)."""
    aliases_of = manifest.aliases_of()
    return {name: view for bucket, buffer in zip(manifest.buckets, buffers, strict=True)
            for name, view in bucket_views(bucket, buffer, aliases_of)}
