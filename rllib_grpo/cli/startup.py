"""Start-up time: what the demo does to reach its first training step sooner.

Measured on the 2-core CPU machine (`benchmarks/startup.py`, `docs/demo.md`), the demo's
start-up is imports (torch, transformers, RLlib: ~10 s; vLLM alone: ~12 s), ``ray.init``
(~6 s, mostly waiting for the processes it launches) and the vLLM engine (~4 s); the
learner's build is ~0.5 s, so building it in parallel with the engine would gain nothing.

* `prefetch_imports` imports vLLM, torch and transformers in a thread while ``ray.init``
  waits.  Ray's own start-up processes need the CPU too: on a busy machine (load above
  twice the core count) the thread would delay them past Ray's start-up timeouts (seen:
  the raylet gave up waiting for its metrics agent), so it is skipped there.
* `RAY_INIT_QUIET_START` keeps Ray from pre-starting idle worker processes, which the
  demo never uses (its env runner and learner live in the driver) and which would compete
  with these imports for the two cores.
"""

from __future__ import annotations

import os
import threading

# ray.init(_system_config=...): no idle workers started ahead of need.
RAY_INIT_QUIET_START = {"enable_worker_prestart": False, "prestart_worker_first_driver": False}


def machine_has_room() -> bool:
    """Whether the 1-minute load average is below twice the number of cores."""
    try:
        return os.getloadavg()[0] < 2 * (os.cpu_count() or 1)
    except OSError:  # no load average on this platform
        return True


def _import_heavy_modules(with_vllm: bool) -> None:
    try:
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

        if with_vllm:
            from rllib_grpo.samplers.vllm import import_vllm

            import_vllm()
    except Exception:  # noqa: BLE001  (no vLLM, ...: the build imports again and reports it)
        pass


def prefetch_imports(sampler: str) -> threading.Thread | None:
    """Start importing torch, transformers and (for the ``vllm``/``auto`` sampler) vLLM in a
    daemon thread, unless the machine is busy; ``join()`` it before building the algorithm.
    """
    if not machine_has_room():
        return None
    thread = threading.Thread(target=_import_heavy_modules, args=(sampler in ("auto", "vllm"),),
                              name="rllib-grpo-prefetch-imports", daemon=True)
    thread.start()
    return thread
