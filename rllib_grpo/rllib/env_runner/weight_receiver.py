"""The env runners' side of a weight sync: the ``runner_*`` functions the driver
(`rllib_grpo.rllib.algorithm.weight_sync`) runs on them through
``EnvRunnerGroup.foreach_env_runner``.

A runner says where its sampler lives (`runner_endpoint`), then receives by its transport:
``shm``: it maps the node's shared weights file and hands views of it to its sampler's
``load_weights`` (`runner_receive_shared`); ``ipc`` / ``nccl``: its vLLM engine joins
vLLM's weight-transfer engine once (`runner_init_engine`) and takes each sync through
vLLM's API, ``start_weight_update``, ``update_weights``, ``finish_weight_update``
(`runner_update`).  Each records what arrived and the weights' version
(`TextEnvRunner.weights_received`); ``local`` and the object store go through the runner's
``set_state``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import torch

from rllib_grpo.rllib.env_runner.engine import engine_whereabouts
from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
from rllib_grpo.rllib.placement import fake_gpu_ids, fake_gpus, node_id, visible_gpus
from rllib_grpo.samplers.vllm_weights import VLLMWeightTransfer
from rllib_grpo.weights.plan import Endpoint
from rllib_grpo.weights.shm import SharedOffer, SharedWeights


def runner_endpoint(runner: TextEnvRunner) -> dict[str, Any]:
    """Where the runner's sampler lives (`Endpoint`: the GPUs of its engine's ranks as its
    workers report them; where the GPUs are fake, those Ray assigned its engine, so that the
    planner decides as for real ones), the dtype it takes weights in and the vLLM
    weight-transfer backend its engine was started with (None: none)."""
    sampler = runner.sampler
    if fake_gpus():
        gpus = tuple(g for where in engine_whereabouts(sampler, runner.engine_shards)
                     for g in fake_gpu_ids(where))
        vllm_gpu = bool(gpus) and runner.config.sampler != "hf"
    else:
        on_gpu = sampler.device.type == "cuda"
        # A vLLM engine's workers say where they run (a colocated TP engine narrowed
        # CUDA_VISIBLE_DEVICES to its GPUs, which this process's CUDA may not have seen).
        gpus = tuple(getattr(sampler, "rank_gpus", ()) or visible_gpus()) if on_gpu else ()
        vllm_gpu = on_gpu and bool(getattr(sampler, "takes_gpu_engines", False))
    endpoint = Endpoint(node_id(), os.getpid(), "cuda" if gpus else "cpu", gpus,
                        vllm_gpu=vllm_gpu, in_driver=runner.worker_index == 0)
    return {"index": runner.worker_index, "endpoint": endpoint, "dtype": sampler.weight_dtype,
            "backend": getattr(sampler, "weight_transfer_backend", None)}


def runner_receive_shared(runner: TextEnvRunner, offer: SharedOffer) -> None:
    """Load the weights learner rank 0 wrote into the node's shared file (mapped once per
    file); raises, loading nothing, on a file that does not hold this sync, and after
    loading, if a later write began meanwhile."""
    shared = runner.shared_weights
    if shared is None or shared.path != offer.path:
        if shared is not None:
            shared.close()
        shared = runner.shared_weights = SharedWeights.open(offer.path, offer.manifest.nbytes)
    start = time.perf_counter()
    runner._load_weights(shared.read(offer.manifest, offer.stamp))
    shared.check_unchanged(offer.stamp)
    runner.weights_received({"bytes": offer.manifest.nbytes,
                             "seconds": time.perf_counter() - start}, offer.seq_no)


def runner_init_engine(runner: TextEnvRunner, init_infos: dict[int, dict],
                       names: list[str]) -> None:
    """vLLM's ``init_weight_transfer_engine`` on the runner's engine with its init info
    (``ipc``: the packed flag; ``nccl``: the group's id, this engine's first rank, the
    group's size), after refusing a foreign or partial set of names before a byte moves."""
    sampler = _vllm_engine(runner)
    sampler.check_weight_names(names)
    sampler.init_weight_transfer_engine(init_infos[runner.worker_index])


def runner_update(runner: TextEnvRunner, update_info: dict | None = None, start: bool = False,
                  finish_seq_no: int | None = None) -> None:
    """One step of a sync through vLLM's API: ``start`` begins it, ``update_info`` (vLLM's,
    e.g. one ``ipc`` chunk or the whole ``nccl`` broadcast's metadata) is received, and
    ``finish_seq_no`` finishes it, recording the version."""
    sampler = _vllm_engine(runner)
    if start:
        sampler.start_weight_update()
        runner.weight_update = {"bytes": 0.0, "start": time.perf_counter()}
    if update_info is not None:
        sampler.update_weights(update_info)
        runner.weight_update["bytes"] += _update_bytes(update_info)
    if finish_seq_no is not None:
        sampler.finish_weight_update()
        update, runner.weight_update = runner.weight_update, {}
        runner.weights_received({"bytes": update.get("bytes", 0.0), "seconds":
                                 time.perf_counter() - update.get("start", time.perf_counter())},
                                finish_seq_no)


def _vllm_engine(runner: TextEnvRunner) -> VLLMWeightTransfer:
    if not isinstance(runner.sampler, VLLMWeightTransfer):
        raise TypeError(f"env runner {runner.worker_index}'s {type(runner.sampler).__name__} "
                        "takes no vLLM weight-transfer engine")
    return runner.sampler


def _update_bytes(update_info: dict) -> float:
    """Bytes an update info of vLLM's carries (names, dtype names, shapes)."""
    return float(sum(math.prod(shape) * torch.empty((), dtype=getattr(torch, dtype)).element_size()
                     for dtype, shape in zip(update_info["dtype_names"], update_info["shapes"],
                                             strict=True)))
