"""The env runner's side of a weight sync, in its own process: the calls a learner's trainer
engine makes through its client (`rllib_grpo.rllib.algorithm.weight_client`) and the
driver's checks (`rllib_grpo.rllib.algorithm.weight_sync`).

The runner's sampler does the receiving through vLLM's weight-transfer API
(`rllib_grpo.weights.receiver.WeightReceiver`: ``init_weight_transfer_engine``, then per
sync ``start_weight_update`` / ``update_weights`` / ``finish_weight_update``).  Here the
runner describes where it lives, keeps the token of the engine it joined (after a restart it
has none, which tells the driver to connect again), checks each new layout before a byte
moves, and records what arrived (bytes, seconds, the weights' sequence number).
"""

from __future__ import annotations

import os
import time

from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
from rllib_grpo.rllib.placement import node_id, visible_gpus
from rllib_grpo.weights.layout import Manifest
from rllib_grpo.weights.plan import Endpoint
from rllib_grpo.weights.wire import update_nbytes


def runner_endpoint(runner: TextEnvRunner) -> Endpoint:
    """Where a runner's sampler lives (its ranks' GPUs), its dtype, how many group ranks it takes (0: it
    cannot join a weight engine, so only ``local`` or the object store reach it), whether it
    loads vLLM's GPU engines, and whether it is the driver's own runner (index 0)."""
    sampler = runner.sampler
    device = sampler.device.type
    # A vLLM engine's workers say where they run (a colocated TP engine narrowed
    # CUDA_VISIBLE_DEVICES to its GPUs, which this process's CUDA may not have seen).
    gpus = (tuple(getattr(sampler, "rank_gpus", ()) or visible_gpus())
            if device == "cuda" else ())
    return Endpoint(node_id(), os.getpid(), device, gpus,
                    sampler.weight_dtype, sampler.num_weight_ranks,
                    gpu_engines=bool(getattr(sampler, "takes_gpu_engines", False)),
                    in_driver=runner.worker_index == 0)


def runner_init_engine(runner: TextEnvRunner, init_info: dict, token: str) -> None:
    """vLLM's ``init_weight_transfer_engine`` on the sampler; keep the engine's token."""
    runner.weight_group_token = None
    runner.sampler.init_weight_transfer_engine(init_info)
    runner.weight_group_token = token


def runner_start_update(runner: TextEnvRunner) -> None:
    runner.sampler.start_weight_update()
    runner.weight_update = {"bytes": 0.0, "start": time.perf_counter()}


def runner_update_weights(runner: TextEnvRunner, update_info: dict) -> None:
    runner.sampler.update_weights(update_info)
    runner.weight_update["bytes"] = runner.weight_update.get("bytes", 0.0) + float(
        update_nbytes(update_info))


def runner_finish_update(runner: TextEnvRunner, seq_no: int) -> None:
    """Finish the update and record it (the runner's ``weight_sync/bytes``, load time)."""
    runner.sampler.finish_weight_update()
    update, runner.weight_update = runner.weight_update, {}
    runner.weights_received({"bytes": update.get("bytes", 0.0), "seconds": time.perf_counter()
                             - update.get("start", time.perf_counter())}, seq_no)


def runner_update_round(runner: TextEnvRunner, update_info: dict, seq_no: int) -> None:
    """A whole update in one call (start, update, finish: the sampler still gets vLLM's
    three calls): the driver's client makes one round trip per sync, not three."""
    runner_start_update(runner)
    runner_update_weights(runner, update_info)
    runner_finish_update(runner, seq_no)


def runner_leave(runner: TextEnvRunner) -> None:
    """Leave (shut down) the runner's weight engine: the algorithm stops."""
    runner.sampler.shutdown_weight_transfer_engine()
    runner.weight_group_token = None


def runner_prepare(runner: TextEnvRunner, manifest: Manifest) -> str | None:
    """Refuse a partial or foreign layout before a byte moves; returns the runner's engine
    token (None after a restart)."""
    runner.sampler.prepare_weights(manifest, None, check=True, in_place=True)
    return runner.weight_group_token
