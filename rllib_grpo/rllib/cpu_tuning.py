"""CPU tuning: what a run that computes on CPUs changes in its own processes, and only there.

Two entry points, each a no-op for a run on GPUs:

* `cpu_start_up` wraps the driver's ``ray.init`` (`rllib_grpo.init_local_ray`) when
  `runs_on_cpu`: the run's modules (the algorithm, the env runner, the learner, and vLLM
  where its engine runs in this process) are imported in a background thread at a lower
  CPU priority while Ray's GCS, raylet and agents come up, with Python's garbage collector
  paused while they load (`collections_paused`);
* `tune_cpu_learner`, from the learner's build on a CPU device: glibc's allocator keeps
  freed memory for the next step (`keep_freed_host_memory`, unless the setting of that
  name is off), and the models attend with two matmuls at a 16-bit compute dtype
  (`rllib_grpo.models.attention.prefer_matmul_attention`).

benchmarks/README.md has what each of them saves on the 2-core machine.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import gc
import importlib
import logging
import os
import platform
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from rllib_grpo.rllib.config.grpo_config import ClassByPath, GRPOConfig

if TYPE_CHECKING:  # torch loads in the start-up's import thread, not before it
    import torch

logger = logging.getLogger(__name__)
PREFETCH_NICE = 10
# vLLM's entry point, then its worker (~490 modules that the engine's start and the weight
# reload check import otherwise).
VLLM_MODULES = ("vllm", "vllm.v1.worker.gpu_worker")
# glibc's mallopt parameters (malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
NO_TRIM = -1  # mallopt(M_TRIM_THRESHOLD, -1): never give the heap's top back (man mallopt)

_kept = False


def runs_on_cpu(config: GRPOConfig) -> bool:
    """Whether ``config``'s learners and env runners all compute on CPUs (no GPU asked)."""
    return not config.learners_on_gpus and not config.num_gpus_per_env_runner


# ------------------------------------------------------------------------ start-up
@contextlib.contextmanager
def cpu_start_up(config: GRPOConfig) -> Iterator[None]:
    """Around the driver's ``ray.init``: on a CPU run (`runs_on_cpu`) import
    `modules_to_prefetch` in a thread meanwhile, with collections paused; returns once both
    are done (also when ``ray.init`` raises: no import left running behind the caller).
    Elsewhere it does nothing."""
    if not runs_on_cpu(config):
        yield
        return
    prefetch = threading.Thread(target=_import_quietly, args=(modules_to_prefetch(config),),
                                name="rllib-grpo-prefetch", daemon=True)
    with collections_paused():
        prefetch.start()
        try:
            with _no_second_ray():
                yield
        finally:
            prefetch.join()


def modules_to_prefetch(config: GRPOConfig) -> list[str]:
    """What this process will import to build ``config``'s algorithm: the algorithm, env
    runner and learner modules, and vLLM where its engine may run here (the local env
    runner samples, ``num_env_runners=0``, with sampler ``vllm`` or ``auto``)."""
    paths = [ClassByPath.path(config, name) for name in ("algo_class", "env_runner_cls")]
    paths.append(config.learner_class_path())
    modules = [path.rpartition(".")[0] for path in paths if isinstance(path, str)]
    if config.sampler in ("auto", "vllm") and not config.num_env_runners:
        modules.extend(VLLM_MODULES)
    return modules


def _import_quietly(modules: list[str]) -> None:
    # Below Ray's own processes, which have start-up timeouts, on a busy machine.
    try:  # Linux: a thread's own nice value (its id is a task id)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREFETCH_NICE)
    except (AttributeError, OSError):
        pass
    for module in modules:
        try:
            if module == "vllm":
                from vllm import LLM  # noqa: F401  (vllm's package is lazy: LLM is the cost)
            else:
                importlib.import_module(module)
        except Exception as error:  # noqa: BLE001  (the run's own import reports it)
            logger.debug("prefetch of %s failed: %r", module, error)


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """No garbage collection inside; on the way out every object tracked so far is frozen
    (``gc.freeze()``: later collections skip it) and collections resume if they were on.

    For start-up imports: their ~1.3 million objects live as long as the process, and each
    full collection that their creation triggers scans all of those made so far while
    finding little.  vLLM freezes its own heap the same way once its engine is up."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        # At exit the interpreter's last collection must see them again: extension objects
        # frozen for good are never freed, and nanobind (triton's bindings) then prints
        # hundreds of "leaked" lines after the run's output.
        atexit.unregister(gc.unfreeze)
        atexit.register(gc.unfreeze)
        if was_enabled:
            gc.enable()


@contextlib.contextmanager
def _no_second_ray() -> Iterator[None]:
    """Hold Ray's auto-init lock while this thread runs ``ray.init``.

    Ray calls ``ray.init()`` by itself when its API is used before Ray is up (its
    "auto-init"), under this lock.  The import thread can use the API half way through our
    ``ray.init``: the algorithm's module registers it with Tune, whose registry writes to
    the GCS as soon as the GCS client is set, and the driver's job id is asked for before
    the driver is connected.  That auto-init would start a second local cluster (GCS,
    raylet, agents) for the whole run.  Holding the lock makes it wait for ours; once ours
    is up, auto-init finds Ray initialized and does nothing.  (A private name: Ray is
    pinned to 2.60.x, and the test of this race fails loudly if it moves.)"""
    from ray._private.auto_init_hook import auto_init_lock

    with auto_init_lock:
        yield


# ------------------------------------------------------------------------ learner
def tune_cpu_learner(config: GRPOConfig, device: torch.device,
                     models: Iterable[torch.nn.Module]) -> None:
    """A learner's CPU tuning, where ``device`` is a CPU (elsewhere nothing): freed host
    memory kept (``config.keep_freed_host_memory``) and matmul attention for ``models``
    at a 16-bit ``config.compute_dtype``."""
    if device.type != "cpu":
        return
    from rllib_grpo.models.attention import prefer_matmul_attention

    if config.keep_freed_host_memory:
        keep_freed_host_memory()
    for model in models:
        prefer_matmul_attention(model, device, config.compute_dtype)


def keep_freed_host_memory() -> bool:
    """Make glibc's malloc serve every block from its heap (``M_MMAP_MAX`` 0) and never
    trim the heap (``M_TRIM_THRESHOLD`` -1): memory a tensor frees is reused by the next
    one instead of returned to the kernel.  Process-wide and not undone; a second call does
    nothing.  Returns True where it took effect (glibc), False elsewhere (macOS, musl).

    A CPU learner's step allocates the same large tensors every step (logits, activations
    and their gradients: gigabytes on SmolLM2-135M).  Above its mmap threshold glibc serves
    each with a fresh ``mmap`` and gives it back with ``munmap``, so every step would
    page-fault its tensors in again, each page zeroed by the kernel.  The cost: the
    process's resident memory stays at its peak, and the peak grows, since a block freed
    inside the heap serves only blocks that fit it."""
    global _kept
    if _kept:
        return True
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # mallopt returns 1 on success, 0 on error.
    _kept = bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NO_TRIM))
    if not _kept:
        logger.warning("mallopt refused; freed host memory goes back to the kernel")
    return _kept

