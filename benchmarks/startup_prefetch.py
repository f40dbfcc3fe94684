"""Does `rllib_grpo.cli.startup.prefetch_imports` shorten the demo's start-up?

    python -m benchmarks.startup_prefetch prefetch|plain   # one fresh process per call

Seconds from just before ``ray.init`` (the demo's arguments) until Ray is up and vLLM,
torch and transformers are imported, with the import thread (forced on, whatever the load
average) or without it.  Alternate the two modes run by run on a shared machine.
"""

from __future__ import annotations

import logging
import sys
import time


def main(argv: list[str] | None = None) -> int:
    mode = (argv if argv is not None else sys.argv[1:] or ["prefetch"])[0]
    if mode not in ("prefetch", "plain"):
        raise SystemExit("usage: python -m benchmarks.startup_prefetch prefetch|plain")
    from rllib_grpo.logs import quiet_console

    quiet_console(verbose=False)
    import ray

    from rllib_grpo.cli import startup

    t0 = time.perf_counter()
    thread = None
    if mode == "prefetch":
        startup.machine_has_room = lambda: True
        thread = startup.prefetch_imports("vllm")
    ray.init(address="local", num_cpus=2, object_store_memory=500 * 1024**2,
             include_dashboard=False, log_to_driver=False, configure_logging=False,
             logging_level=logging.WARNING, _system_config=startup.RAY_INIT_QUIET_START)
    ray_up = time.perf_counter() - t0
    if thread is not None:
        thread.join()
    startup._import_heavy_modules(True)  # the rest (all of it without the thread)
    print(f"{mode}: ray.init {ray_up:.1f}s, ready {time.perf_counter() - t0:.1f}s", flush=True)
    ray.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
