"""The weight-transfer half of `rllib_grpo.samplers.hf.HFSampler`: vLLM's API
(``init_weight_transfer_engine``, then per sync ``start_weight_update`` / ``update_weights``
/ ``finish_weight_update``) over our host-memory engines (``grpo_shm``, ``grpo_gloo``,
``grpo_sparse_gloo``; `rllib_grpo.weights.wire.HostReceiver` receives), and the in-place copy
every load ends in.

Weights stream in by bucket and are copied into the live parameters (in place, cast to the
model's dtype); once per layout `prepare_weights` may lay the parameters out like the
buckets (`HFWeightTransfer._home`), so that a broadcast bucket lands in them directly.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.transport import GroupSpec, SlotsSpec
from rllib_grpo.weights.wire import (
    HOST_BACKENDS,
    SPARSE_BACKENDS,
    BucketUpdate,
    DispatchInit,
    GroupInit,
    HostReceiver,
    apply_patch,
    manifest_from_wire,
    manifest_to_wire,
)


class HFWeightTransfer:
    """Mixed into `HFSampler` (which sets ``model`` and ``device``, and calls
    `_init_weight_transfer` in its constructor): the receiving side of every weight sync."""

    model: Any
    device: torch.device

    def _init_weight_transfer(self) -> None:
        self._weight_receiver = HostReceiver()
        self._transfer_backend: str | None = None
        self._live: dict[str, torch.Tensor] | None = None  # parameters and buffers by name
        self._checked_names: tuple | None = None
        self._homes: list[torch.Tensor | None] = []  # per bucket: the parameters' memory
        self._homed: str | None = None  # the layout they follow

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype weights should travel in: the model's."""
        return next(self.model.parameters()).dtype

    @property
    def num_weight_ranks(self) -> int:
        """One rank in a weight group: the sampler's own process."""
        return 1

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """vLLM's API on the transformers sampler: join the group of one of our host-memory
        engines (``grpo_shm``, ``grpo_gloo``, ``grpo_sparse_gloo``; vLLM's own are GPU
        engines for vLLM models)."""
        info = DispatchInit(**init_info)
        if info.backend not in HOST_BACKENDS:
            raise ValueError(f"the transformers sampler takes weights through "
                             f"{', '.join(HOST_BACKENDS)}, not {info.backend!r}")
        self._weight_receiver.init(GroupInit(**info.init_info))
        self._transfer_backend = info.backend

    def start_weight_update(self) -> None:
        """Nothing to prepare: weights are copied into the live parameters."""

    def update_weights(self, update_info: dict) -> None:
        """Receive one update into the model: dense buckets (into the parameters themselves
        where `prepare_weights` laid them out so) or sparse patches, in place."""
        if self._transfer_backend in SPARSE_BACKENDS:
            self._apply_patches(self._weight_receiver.patches(update_info))
            return
        manifest = manifest_from_wire(update_info["manifest"])
        homes = self._homes if manifest.fingerprint == self._homed else None
        self._copy_into_model(self._weight_receiver.stream(update_info, homes=homes))

    def finish_weight_update(self) -> None:
        """Nothing to finish: the copies are done when `update_weights` returns."""

    def shutdown_weight_transfer_engine(self) -> None:
        self._weight_receiver.close()
        self._transfer_backend = None

    @torch.no_grad()
    def _apply_patches(self, patches: Iterable[Any]) -> None:
        live = self._live_tensors()
        for patch in patches:
            apply_patch(live[patch.name], patch)

    def join_weight_group(self, spec: GroupSpec, rank: int) -> None:
        """Join a weight group as ``rank`` (``grpo_gloo``/``grpo_shm``)."""
        self._weight_receiver.init(GroupInit.of(spec, rank_offset=rank))
        self._transfer_backend = "grpo_gloo"

    def prepare_weights(self, manifest: Manifest, slots: SlotsSpec | None = None,
                        check: bool = True, in_place: bool = True) -> None:
        """Refuse a partial or foreign manifest (before any byte moves); keep the slots;
        with ``in_place``, lay the parameters out like the manifest's buckets (once per
        layout), so that a broadcast bucket lands in the parameters themselves."""
        if check:
            self._check_names(manifest.names(), manifest.partial)
        self._slots = slots
        if in_place and not manifest.partial and manifest.fingerprint != self._homed:
            self._home(manifest)

    def receive_weights(self, manifest: Manifest, via: str, ipc: dict | None = None,
                        materialize: bool = False) -> dict:
        """Stream a sync from the joined group into the model; ``materialize`` returns the
        tensors (copies) instead, for a payload the caller rebuilds (LoRA)."""
        if ipc is not None or via not in ("shm", "collective"):
            raise ValueError(f"receive_weights takes 'shm' or 'collective' syncs, not {via!r}")
        start = time.perf_counter()
        slots = getattr(self, "_slots", None) if via == "shm" else None
        info = BucketUpdate(manifest_to_wire(manifest), list(slots.paths) if slots else None,
                            slots.nbytes if slots else 0)
        homes = self._homes if manifest.fingerprint == self._homed else None
        stream = self._weight_receiver.stream(info, homes=homes)
        if materialize:
            tensors = {name: tensor.detach().to("cpu", copy=True) for name, tensor in stream}
            return {"tensors": tensors, "seconds": time.perf_counter() - start}
        self._copy_into_model(stream)
        return {"bytes": manifest.nbytes, "seconds": time.perf_counter() - start}

    def leave_weight_group(self) -> None:
        """Leave the weight group (a no-op outside one)."""
        self.shutdown_weight_transfer_engine()

    def _check_names(self, names: set[str], partial: bool) -> None:
        key = (frozenset(names), partial)
        if key != self._checked_names:  # the same names every sync: check them once
            _check_state_dict_keys(self.model, names, partial=partial)
            self._checked_names = key

    @torch.no_grad()
    def _copy_into_model(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy in place; a tied weight given under both names is copied once, a tensor
        received into the parameter itself (see `_home`) not at all."""
        live = self._live_tensors()
        done: set[int] = set()
        for name, tensor in weights:
            target = live[name]
            if id(target) in done:
                continue
            tensor = torch.as_tensor(tensor)
            if target.shape != tensor.shape:  # copy_ would broadcast silently
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} does not fit the "
                                 f"sampler's {tuple(target.shape)}")
            if not (tensor.data_ptr() == target.data_ptr() and tensor.dtype == target.dtype
                    and tensor.stride() == target.stride()):
                target.copy_(tensor)
            done.add(id(target))

    def _live_tensors(self) -> dict[str, torch.Tensor]:
        if self._live is None:
            self._live = self.model.state_dict(keep_vars=True)
        return self._live

    @torch.no_grad()
    def _home(self, manifest: Manifest) -> None:
        """Move each bucket's parameters (those of its dtype and shape) into one flat
        tensor laid out like the bucket: the parameters become views of it."""
        live = self._live_tensors()
        homes: list[torch.Tensor | None] = []
        for bucket in manifest.buckets:
            found = [live.get(e.name) for e in bucket.entries]
            targets = [t for t in found if t is not None]
            if len(targets) < len(found) or any(
                    t.dtype != bucket.dtype or tuple(t.shape) != e.shape
                    for t, e in zip(targets, bucket.entries, strict=True)):
                homes.append(None)
                continue
            flat = torch.empty(bucket.numel, dtype=bucket.dtype, device=self.device)
            for entry, target in zip(bucket.entries, targets, strict=True):
                view = flat.narrow(0, entry.offset, entry.numel).view(entry.shape)
                view.copy_(target)
                target.data = view
            homes.append(flat)
        self._homes, self._homed = homes, manifest.fingerprint


def _check_state_dict_keys(
    model: torch.nn.Module, state_dict: Mapping[str, torch.Tensor] | set[str],
    partial: bool = False,
) -> None:
    expected = set(model.state_dict())
    missing = set() if partial else expected - set(state_dict) - _tied_aliases(model, set(state_dict))
    unexpected = set(state_dict) - expected
    if missing or unexpected:
        raise KeyError(
            f"state dict does not match the sampler's model: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )


def _tied_aliases(model: torch.nn.Module, provided: set[str]) -> set[str]:
    """State-dict keys that share storage with a provided key (a tied ``lm_head.weight``)."""
    by_storage: dict[int, set[str]] = {}
    for name, tensor in model.state_dict().items():
        by_storage.setdefault(tensor.data_ptr(), set()).add(name)
    return {name for names in by_storage.values() if names & provided for name in names - provided}
