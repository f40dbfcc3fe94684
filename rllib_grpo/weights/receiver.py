"""`WeightReceiver`: the receiving side of a weight sync, as every sampler implements it.

A sync (`rllib_grpo.rllib.algorithm.weight_sync` drives it) asks each env runner's
sampler where it lives (``device``), in which dtype the weights should travel
(``weight_dtype``) and how many ranks it takes in a weight group (``num_weight_ranks``;
0: it cannot join one, so only an in-process hand-over or Ray's object store reach it).
Then, for a group transport: ``join_weight_group`` once per group, ``prepare_weights``
once per layout (check the names before a byte moves, map the shared-memory slots) and
``receive_weights`` per sync; ``leave_weight_group`` when the group is gone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: the contract itself imports no transport
    import torch

    from rllib_grpo.weights.layout import Manifest
    from rllib_grpo.weights.transport import GroupSpec, SlotsSpec


@runtime_checkable
class WeightReceiver(Protocol):
    """What a weight sync needs of a sampler (`rllib_grpo.samplers.base.Sampler` extends it)."""

    @property
    def device(self) -> torch.device:
        """Where the sampler's weights live (only the type counts: ``cpu`` or ``cuda``)."""
        ...

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the weights should travel in (the sampler's own)."""
        ...

    @property
    def num_weight_ranks(self) -> int:
        """Ranks the sampler takes in a weight group (vLLM: one per worker); 0: it cannot
        join one."""
        ...

    def join_weight_group(self, spec: GroupSpec, rank: int) -> None:
        """Join the group ``spec`` as ranks ``rank`` .. ``rank + num_weight_ranks - 1``."""
        ...

    def prepare_weights(self, manifest: Manifest, slots: SlotsSpec | None = None,
                        check: bool = True, in_place: bool = True) -> None:
        """Before the first sync of a layout: with ``check`` refuse a partial or foreign
        manifest; map the shared-memory ``slots`` (``shm``); with ``in_place`` the
        sampler may lay its parameters out like the buckets (where it can)."""
        ...

    def receive_weights(self, manifest: Manifest, via: str, ipc: dict | None = None,
                        materialize: bool = False) -> dict:
        """Take one sync ``via`` a transport (``ipc``: the shared CUDA tensors) into the
        sampler; returns ``{"bytes", "seconds"}``, or with ``materialize`` the tensors
        themselves (``{"tensors", "seconds"}``) for a payload the caller rebuilds (LoRA)."""
        ...

    def leave_weight_group(self) -> None:
        """Leave the group (a no-op outside one)."""
        ...
