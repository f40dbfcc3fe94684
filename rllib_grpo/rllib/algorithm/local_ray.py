"""Start a local Ray for one GRPO run.

    config = GRPOConfig().training(...)
    init_local_ray(config)          # instead of ray.init(): a Ray of this process's own
    algo = config.build_algo()

On a CPU run the run's imports are made while Ray starts (`rllib_grpo.rllib.cpu_tuning`).
With everything in this process (no env runner or learner actors) Ray starts no idle
workers ahead of need (`ray_system_config`).
"""

from __future__ import annotations

from typing import Any

from rllib_grpo.rllib.config.grpo_config import GRPOConfig
from rllib_grpo.rllib.cpu_tuning import cpu_start_up


def ray_system_config(config: GRPOConfig) -> dict[str, bool]:
    """Ray's settings for ``config``: with no env runner or learner actors (everything in
    this process) no idle Ray workers are started ahead of need (each is a Python process
    of ~50 MB); reward actors, if any, start their workers when they are created."""
    in_process = not config.num_env_runners and not config.num_learners
    return {"enable_worker_prestart": False, "prestart_worker_first_driver": False} \
        if in_process else {}


def init_local_ray(config: GRPOConfig, **ray_kwargs: Any) -> None:
    """``ray.init`` of a new local Ray (``address="local"``: even where a cluster runs)
    for ``config``, with its CPU start-up (`rllib_grpo.rllib.cpu_tuning.cpu_start_up`).

    ``ray_kwargs`` go to ``ray.init`` (``num_cpus``, ``object_store_memory``, ...);
    ``include_dashboard`` defaults to False and ``_system_config`` to `ray_system_config`."""
    import ray

    ray_kwargs.setdefault("include_dashboard", False)
    ray_kwargs.setdefault("_system_config", ray_system_config(config))
    with cpu_start_up(config):
        ray.init(address="local", **ray_kwargs)
