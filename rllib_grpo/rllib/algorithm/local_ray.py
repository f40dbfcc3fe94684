"""Start a local Ray for one GRPO run, importing what the run needs while it starts.

    config = GRPOConfig().training(...)
    init_local_ray(config)          # instead of ray.init(): a Ray of this process's own
    algo = config.build_algo()

``ray.init`` mostly waits (2-3 s on a 2-core machine) for its GCS, raylet and agents to
come up; meanwhile a background thread imports the algorithm, the env runner and the
learner (transformers, ~3 s) and, where the vLLM engine will run in this process, vLLM
(~4.5 s).  The thread runs at a lower CPU priority (nice +10) so that on a busy machine
Ray's own processes, which have start-up timeouts, go first.  Measured on the quiet 2-core
machine (`python -m benchmarks.startup_overlap --sampler hf|vllm`, fresh processes taken
in turns): from the config built to Ray up and the imports done, 7.2 s one after the other
and 5.4 s overlapped with the transformers sampler, 12.7 and 9.6 s with vLLM.  An import
that fails in the thread fails again, with its real error, where the run imports it.

With everything in this process (no env runner or learner actors) Ray starts no idle
workers ahead of need (`ray_system_config`).

Python's garbage collector is paused while the modules load (`collections_paused`): the
imports create ~1.3 million long-lived objects, and each full collection they trigger scans
all of those made so far; vLLM's import alone took 8.0 s with collections and 5.7 s without
(3 fresh processes each, in turns).  The objects are then frozen, as vLLM freezes its own
heap once its engine is up, so later collections skip them.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

from rllib_grpo.rllib.config.grpo_config import ClassByPath, GRPOConfig
from rllib_grpo.startup import startup_part

logger = logging.getLogger(__name__)
PREFETCH_NICE = 10
# vLLM's entry point, then its worker (~490 modules, ~0.8 s, that the engine's start and our
# weight-reload check import otherwise).
VLLM_MODULES = ("vllm", "vllm.v1.worker.gpu_worker")


def ray_system_config(config: GRPOConfig) -> dict[str, bool]:
    """Ray's settings for ``config``: with no env runner or learner actors (everything in
    this process) no idle Ray workers are started ahead of need (each is a Python process
    of ~50 MB); reward actors, if any, start their workers when they are created."""
    in_process = not config.num_env_runners and not config.num_learners
    return {"enable_worker_prestart": False, "prestart_worker_first_driver": False} \
        if in_process else {}


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

    For start-up imports: their objects live as long as the process, and a collection run
    while they load finds little (~26,000 unreachable objects among 1.3 million after Ray,
    RLlib, transformers and vLLM load; they stay, frozen: the process's PSS after those
    imports was 865 MB against 843 MB with collections on)."""
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


def init_local_ray(config: GRPOConfig, **ray_kwargs: Any) -> None:
    """``ray.init`` of a new local Ray (``address="local"``: even where a cluster runs)
    for ``config``, importing `modules_to_prefetch` meanwhile; returns once both are done.

    ``ray_kwargs`` go to ``ray.init`` (``num_cpus``, ``object_store_memory``, ...);
    ``include_dashboard`` defaults to False and ``_system_config`` to `ray_system_config`.
    The wait for both counts as the ``ray`` part of start-up (`rllib_grpo.startup`)."""
    import ray

    ray_kwargs.setdefault("include_dashboard", False)
    ray_kwargs.setdefault("_system_config", ray_system_config(config))
    prefetch = threading.Thread(target=_import_quietly, args=(modules_to_prefetch(config),),
                                name="rllib-grpo-prefetch", daemon=True)
    with startup_part("ray"), collections_paused():
        prefetch.start()
        try:
            with _no_second_ray():
                ray.init(address="local", **ray_kwargs)
        finally:  # also when ray.init raises: no import left running behind the caller
            prefetch.join()


@contextlib.contextmanager
def _no_second_ray() -> Iterator[None]:
    """Hold Ray's auto-init lock while this thread runs ``ray.init``.

    Ray calls ``ray.init()`` by itself when its API is used before Ray is up (its
    "auto-init"), under this lock.  The import thread can use the API half way through our
    ``ray.init``: the algorithm's module registers it with Tune, whose registry writes to
    the GCS as soon as the GCS client is set, and the driver's job id is asked for before
    the driver is connected.  That auto-init then started a second local cluster (GCS,
    raylet, agents) for the whole run.  Holding the lock makes it wait for ours; once ours
    is up, auto-init finds Ray initialized and does nothing.  (A private name: Ray is
    pinned to 2.60.x, and the test of this race fails loudly if it moves.)"""
    from ray._private.auto_init_hook import auto_init_lock

    with auto_init_lock:
        yield
