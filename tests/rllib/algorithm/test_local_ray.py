"""`init_local_ray`: Ray started for one run, a CPU run's imports made while it starts
(`rllib_grpo.rllib.cpu_tuning.cpu_start_up`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rllib_grpo.rllib.algorithm.local_ray import ray_system_config
from rllib_grpo.rllib.config.grpo_config import GRPOConfig
from rllib_grpo.rllib.cpu_tuning import modules_to_prefetch

# Each test starts the local Ray (in a subprocess).
pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[3]
ALGORITHM_MODULE = "rllib_grpo.rllib.algorithm.grpo"
ENV_RUNNER_MODULE = "rllib_grpo.rllib.env_runner.env_runner"
LEARNER_MODULE = "rllib_grpo.rllib.learner.learner"


def test_prefetch_lists_the_run_s_classes_and_vllm_only_where_its_engine_runs_here() -> None:
    local_vllm = GRPOConfig().training(sampler="vllm")
    assert modules_to_prefetch(local_vllm) == [ALGORITHM_MODULE, ENV_RUNNER_MODULE,
                                               LEARNER_MODULE, "vllm", "vllm.v1.worker.gpu_worker"]
    assert "vllm" in modules_to_prefetch(GRPOConfig().training(sampler="auto"))
    assert "vllm" not in modules_to_prefetch(GRPOConfig().training(sampler="hf"))
    remote = GRPOConfig().training(sampler="vllm").env_runners(num_env_runners=1)
    assert "vllm" not in modules_to_prefetch(remote)  # the runner actors import it
    sharded = GRPOConfig().learners(num_learners=2)
    assert "rllib_grpo.rllib.learner.fsdp" in modules_to_prefetch(sharded)


def test_prefetch_skips_a_class_already_imported() -> None:
    config = GRPOConfig()
    assert config.algo_class.__module__ == ALGORITHM_MODULE  # read: now a class
    assert ALGORITHM_MODULE not in modules_to_prefetch(config)


def test_the_package_exports_it() -> None:
    import rllib_grpo
    from rllib_grpo.rllib.algorithm.local_ray import init_local_ray

    assert rllib_grpo.init_local_ray is init_local_ray


def test_no_idle_workers_only_when_nothing_runs_in_actors() -> None:
    assert ray_system_config(GRPOConfig()) == {"enable_worker_prestart": False,
                                               "prestart_worker_first_driver": False}
    assert ray_system_config(GRPOConfig().env_runners(num_env_runners=1)) == {}
    assert ray_system_config(GRPOConfig().learners(num_learners=1)) == {}


PROBE = textwrap.dedent("""
    import json, sys
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    from rllib_grpo.rllib.algorithm.local_ray import init_local_ray
    config = GRPOConfig().training(model_path="builtin:tiny", sampler="hf")
    before = {m: m in sys.modules for m in sys.argv[1:]}
    init_local_ray(config, num_cpus=1, object_store_memory=80 * 1024**2,
                   log_to_driver=False, configure_logging=False)
    import ray
    after = {m: m in sys.modules for m in sys.argv[1:]}
    workers = ray._private.worker.global_worker.node._ray_params._system_config
    import gc
    collections = {"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}
    ray.shutdown()
    print(json.dumps({"before": before, "after": after,
                      "system_config": workers, "gc": collections}))
""")


def _run_probe(probe: str, modules: list[str], *extra_paths: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
        str(REPO), *map(str, extra_paths), os.environ.get("PYTHONPATH"))))}
    done = subprocess.run([sys.executable, "-c", probe, *modules], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


CONFIG_PROBE = textwrap.dedent("""
    import json, sys
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    config = GRPOConfig().environment("rllib_grpo/Arithmetic-v0").training(
        model_path="builtin:tiny", sampler="hf", group_size=4)
    print(json.dumps({m: m in sys.modules for m in sys.argv[1:]}))
""")


def test_a_config_is_built_without_importing_transformers() -> None:
    """In a fresh interpreter: what `init_local_ray` overlaps with Ray's start is not
    imported by building the config (it would otherwise come first, alone).  (Its
    ``validate()`` reads the tokenizer: the run validates in ``build_algo``.)"""
    modules = ["transformers", ALGORITHM_MODULE, ENV_RUNNER_MODULE, LEARNER_MODULE]
    assert _run_probe(CONFIG_PROBE, modules) == dict.fromkeys(modules, False)


@pytest.mark.slow
def test_a_config_imports_nothing_heavy_and_init_local_ray_imports_the_run() -> None:
    """In a fresh interpreter: ``GRPOConfig()`` leaves transformers and the algorithm
    unimported (they load while Ray starts), and `init_local_ray` returns with them
    imported and frozen, Ray up with no idle workers."""
    modules = ["transformers", ALGORITHM_MODULE, ENV_RUNNER_MODULE, LEARNER_MODULE]
    report = _run_probe(PROBE, modules)
    assert report["before"] == dict.fromkeys(modules, False)
    assert report["after"] == dict.fromkeys(modules, True)
    assert report["system_config"]["enable_worker_prestart"] is False
    # the imports' objects are frozen (collections skip them) and collections are back on
    assert report["gc"]["enabled"] is True and report["gc"]["frozen"] > 100_000


def test_collections_pause_inside_and_resume_with_the_objects_frozen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.cpu_tuning import collections_paused

    collections: list[int] = []

    def count(phase: str, info: dict) -> None:
        if phase == "start":
            collections.append(info["generation"])

    gc.callbacks.append(count)
    frozen_before = gc.get_freeze_count()
    at_exit: list[object] = []
    monkeypatch.setattr(cpu_tuning.atexit, "register", at_exit.append)
    try:
        with collections_paused():
            assert not gc.isenabled()
            made = [[object()] for _ in range(50_000)]  # far past gen 0's threshold
        assert collections == []
        assert gc.isenabled()
        assert at_exit == [gc.unfreeze]  # the last collection at exit sees them again
        assert gc.get_freeze_count() >= frozen_before + len(made)
        with pytest.raises(RuntimeError), collections_paused():
            raise RuntimeError("ray.init failed")
        assert gc.isenabled()
        gc.disable()  # collections stay off where the caller had them off
        with collections_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()
        gc.callbacks.remove(count)


def test_ray_starts_and_the_imports_run_with_collections_paused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What runs during `init_local_ray` (Ray's start, the import thread) runs with no
    garbage collection; collections are back on once it returns."""
    import gc

    import ray

    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.algorithm import local_ray

    seen: dict[str, bool] = {}

    def fake_init(**kwargs: object) -> None:
        seen["ray.init"] = gc.isenabled()

    def fake_imports(modules: list[str]) -> None:
        seen["imports"] = gc.isenabled()

    monkeypatch.setattr(ray, "init", fake_init)
    monkeypatch.setattr(cpu_tuning, "_import_quietly", fake_imports)
    try:
        local_ray.init_local_ray(GRPOConfig())
    finally:
        gc.unfreeze()
    assert seen == {"ray.init": False, "imports": False}
    assert gc.isenabled()


# A module imported by the prefetch thread that touches Ray's API while `ray.init` is half
# way (its GCS client set, the driver not yet connected): Tune's registry does this when
# the algorithm's import registers it.  Ray's auto-init would start a second cluster.
RACE_MODULE = textwrap.dedent("""
    import time
    import ray
    from ray.experimental.internal_kv import _internal_kv_initialized
    deadline = time.time() + 120
    while not _internal_kv_initialized() and time.time() < deadline:
        time.sleep(0.0005)
    HALF_WAY = not ray.is_initialized()
    JOB_ID = ray.get_runtime_context().get_job_id()
""")
RACE_PROBE = textwrap.dedent("""
    import json
    import psutil
    from rllib_grpo.rllib import cpu_tuning
    from rllib_grpo.rllib.algorithm import local_ray
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig
    cpu_tuning.modules_to_prefetch = lambda config: ["ray_race_module"]
    local_ray.init_local_ray(GRPOConfig(), num_cpus=1, object_store_memory=80 * 1024**2,
                             log_to_driver=False, configure_logging=False)
    import ray, ray_race_module
    tree = psutil.Process().children(recursive=True)
    gcs = sum(1 for p in tree if p.name().startswith("gcs_server"))
    report = {"gcs_servers": gcs, "half_way": ray_race_module.HALF_WAY,
              "same_job": ray_race_module.JOB_ID == ray.get_runtime_context().get_job_id()}
    ray.shutdown()
    print(json.dumps(report))
""")


def test_ray_api_called_from_the_import_thread_mid_start_waits_for_this_ray(
        tmp_path: Path) -> None:
    """A prefetched import that calls Ray while ``ray.init`` is half way (here: once the
    GCS client is set) waits for this process's Ray instead of auto-starting a second
    cluster (seen with SmolLM2's demo: two GCS servers and raylets for the whole run)."""
    (tmp_path / "ray_race_module.py").write_text(RACE_MODULE)
    report = _run_probe(RACE_PROBE, [], tmp_path)
    assert report["half_way"] is True  # the probe did reach the window it tests
    assert report == {"gcs_servers": 1, "half_way": True, "same_job": True}
