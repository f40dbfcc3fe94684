"""The env runner's side of a weight sync (`rllib_grpo.rllib.algorithm.weight_sync` calls these
on each `TextEnvRunner`, in its own process).

The runner's sampler does the receiving (`rllib_grpo.weights.receiver.WeightReceiver`);
here the runner describes where it lives, joins a weight group (and keeps the group's
token: after a restart it has none, which tells the driver to form the group again), checks
and maps each new layout, and records what arrived: a whole state streamed into the
sampler, or a LoRA payload rebuilt and merged as before (`rllib_grpo.models.lora`).
"""

from __future__ import annotations

import os
from typing import Any

from ray.rllib.core import DEFAULT_MODULE_ID

from rllib_grpo.models.lora import LoRAPayload, is_lora_sync
from rllib_grpo.rllib.env_runner.env_runner import (
    COMPONENT_RL_MODULE,
    WEIGHTS_SEQ_NO,
    TextEnvRunner,
)
from rllib_grpo.rllib.placement import node_id, visible_gpus
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.plan import Endpoint
from rllib_grpo.weights.transport import GroupSpec, SlotsSpec


def runner_endpoint(runner: TextEnvRunner) -> Endpoint:
    """Where a runner's sampler lives, its dtype and how many group ranks it takes (0: it
    cannot join a weight group, so only ``local`` or the object store reach it)."""
    sampler = runner.sampler
    device = sampler.device.type
    return Endpoint(node_id(), os.getpid(), device,
                    visible_gpus() if device == "cuda" else (),
                    sampler.weight_dtype, sampler.num_weight_ranks)


def runner_join(runner: TextEnvRunner, spec: GroupSpec, ranks: dict[int, int]) -> None:
    """Join the weight group ``spec`` at this runner's first rank (``ranks`` by runner index)."""
    runner.sampler.join_weight_group(spec, ranks[runner.worker_index])
    runner.weight_group_token = spec.token


def runner_leave(runner: TextEnvRunner) -> None:
    """Leave (shut down) the runner's weight group: the algorithm stops."""
    runner.sampler.leave_weight_group()
    runner.weight_group_token = None


def runner_prepare(runner: TextEnvRunner, manifest: Manifest, slots: SlotsSpec | None
                   ) -> str | None:
    """Check the names (LoRA payloads are checked where they are merged) and map the
    slots; returns the runner's group token (None after a restart)."""
    whole = not is_lora_sync(dict(manifest.meta))
    runner.sampler.prepare_weights(manifest, slots, check=whole, in_place=whole)
    return runner.weight_group_token


def runner_receive(runner: TextEnvRunner, manifest: Manifest, via: str, ipc: dict | None,
                   seq_no: int) -> dict[str, Any]:
    """Receive one sync ``via`` a transport into the sampler; returns the load stats."""
    meta = dict(manifest.meta)
    if is_lora_sync(meta):  # rebuilt and merged as before (`models.lora.AdapterMerger`)
        got = runner.sampler.receive_weights(manifest, via, ipc, materialize=True)
        payload = LoRAPayload.from_tensors(got["tensors"], meta)
        runner.set_state({COMPONENT_RL_MODULE: {DEFAULT_MODULE_ID: payload},
                          WEIGHTS_SEQ_NO: seq_no})
        return dict(runner.last_weight_sync)
    stats = runner.sampler.receive_weights(manifest, via, ipc)
    runner.weights_received(stats, seq_no)
    return stats
