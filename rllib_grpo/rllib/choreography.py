"""verl's memory choreography: how the learners and the vLLM engines that share their GPUs
(`GRPOConfig.sampler_sleeps`) hand the GPU memory to each other, in one place.

At build, each learner materialises only its shard (`rllib_grpo.rllib.learner.fsdp`: the
models built on the meta device, sharded, then filled from rank 0's host copy), so a
learner never holds the whole model on a GPU beside an awake engine.

Each synchronous step (`rllib_grpo.rllib.algorithm.sampling.sync.SynchronousSampling`):

1. the engines sample, awake;
2. **sleep** (`EngineHandOver.sleep`): the engines free their GPU memory, at level 2 where
   the next sync replaces every weight (`sleep_level`): weights and KV cache dropped,
   nothing copied to host memory;
3. the learners update (what the config offloads, `optimizer_offload`, `fsdp_cpu_offload`,
   ``ref_param_offload``, is back in host memory when the update returns);
4. **wake** (`EngineHandOver.wake_for_sync`):

   a. **empty cache**: the learners drop their gradients and give the CUDA caching
      allocator's free blocks back to the driver (`GRPOLearner.release_memory`, verl's
      ``aggressive_empty_cache``): an engine in another process can map only what the
      learner's process has returned;
   b. the engines map their weights again (``wake_up(tags=["weights"])``);
   c. the weight sync;
   d. the learners empty their cache again (what the sync held);
   e. the engines map their KV cache (``wake_up(tags=["kv_cache"])``);

5. the next step samples.

verl's ``rollout_mode`` runs the same order (``aggressive_empty_cache``, ``resume(tags=
["weights"])``, ``update_weights``, ``aggressive_empty_cache``, ``resume(tags=
["kv_cache"])``).  The learners' side (`free_device_memory`) runs in the learner processes,
the engines' (`engine_sleep`, `engine_wake`) in the env runners', each called by the driver.
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

WEIGHTS, KV_CACHE = "weights", "kv_cache"  # vLLM's wake-up tags


def sleep_level(config: Any) -> int:
    """The engines' sleep level during the update: 2 (weights discarded, nothing copied
    to host memory) where every sync replaces every weight; 1 (weights kept in host
    memory) where a sync sends only part of them: LoRA's merged layers, or a ``delta``
    sync's changed elements, which the engine applies to the weights it holds."""
    partial_syncs = config.lora_rank > 0 or config.weight_sync_transport == "delta"
    return 1 if partial_syncs else 2


def free_device_memory() -> None:
    """Return this process's cached GPU memory to the driver (verl's
    ``aggressive_empty_cache``): collect garbage, wait for the device, then free the CUDA
    caching allocator's unused blocks.  Only garbage collection where CUDA is not in use."""
    gc.collect()
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- each side
def learner_release(learner: Any) -> None:
    """On a learner: step 4a/4d (`GRPOLearner.release_memory`)."""
    learner.release_memory()


def engine_sleep(runner: Any, level: int) -> None:
    """On an env runner: its engine frees its GPU memory (step 2)."""
    runner.sampler.sleep(level=level)


def engine_wake(runner: Any, tags: Sequence[str] | None) -> None:
    """On an env runner: its engine maps the memory of ``tags`` again (None: all)."""
    runner.sampler.wake_up(tags=None if tags is None else list(tags))


# --------------------------------------------------------------------------- the driver
@dataclass
class EngineHandOver:
    """The driver's side: it calls each step on the learners (``learner_group``) and on
    every env runner's engine, the local one included (``env_runner_group``)."""

    env_runner_group: Any
    learner_group: Any
    level: int

    def sleep(self) -> None:
        """Step 2: the engines give the GPU to the learners for the update."""
        self._on_engines(partial(engine_sleep, level=self.level))

    def wake_for_sync(self, sync_weights: Any) -> None:
        """Steps 4a-e: the learners free their cache, the engines wake weights first, the
        sync (``sync_weights()``) fills them, the learners free again, the KV cache last."""
        self._on_learners(learner_release)
        self._on_engines(partial(engine_wake, tags=(WEIGHTS,)))
        sync_weights()
        self._on_learners(learner_release)
        self._on_engines(partial(engine_wake, tags=(KV_CACHE,)))

    def wake(self) -> None:
        """Wake everything at once (an update that failed: a restore's sync follows)."""
        self._on_learners(learner_release)
        self._on_engines(partial(engine_wake, tags=None))

    def _on_learners(self, func: Any) -> None:
        self.learner_group._get_results(self.learner_group.foreach_learner(func))

    def _on_engines(self, func: Any) -> None:
        self.env_runner_group.foreach_env_runner(func, local_env_runner=True)
