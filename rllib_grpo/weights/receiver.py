"""`WeightReceiver`: the receiving side of a weight sync, as every sampler implements it.

A sync (`rllib_grpo.rllib.algorithm.weight_sync` drives it) asks each env runner's
sampler where it lives (``device``), in which dtype the weights should travel
(``weight_dtype``) and how many ranks it takes in a weight group (``num_weight_ranks``;
0: it cannot join one, so only an in-process hand-over or Ray's object store reach it).
Then vLLM's weight-transfer API (`rllib_grpo.weights.engines`; the learner's trainer
engine drives it through a client): ``init_weight_transfer_engine`` once per group, per
sync ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``;
``prepare_weights`` once per layout first (check the names before a byte moves).

The older group calls stay: ``join_weight_group`` once per gloo group, ``receive_weights``
per sync (one start/update/finish round), ``leave_weight_group`` when the group is gone.
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

    def init_weight_transfer_engine(self, init_info: dict) -> None:
        """vLLM's: create and join the engine ``init_info`` names (``{"backend",
        "init_info"}``, `rllib_grpo.weights.wire.DispatchInit`)."""
        ...

    def start_weight_update(self) -> None:
        """vLLM's: a weight update begins."""
        ...

    def update_weights(self, update_info: dict) -> None:
        """vLLM's: receive one update chunk (the engine's ``update_info``) into the model."""
        ...

    def finish_weight_update(self) -> None:
        """vLLM's: the update is complete (cached prefixes of the old weights dropped)."""
        ...

    def shutdown_weight_transfer_engine(self) -> None:
        """vLLM's: leave the engine's group (a no-op outside one)."""
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
        """Take one sync ``via`` ``shm`` or ``collective`` (``ipc`` is vLLM's ipc engine
        now) into the sampler; returns ``{"bytes", "seconds"}``, or with ``materialize``
        (the transformers sampler) the tensors themselves (``{"tensors", "seconds"}``)."""
        ...

    def leave_weight_group(self) -> None:
        """Leave the group (a no-op outside one)."""
        ...
