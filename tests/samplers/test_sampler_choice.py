"""``sampler="auto"``: transformers only where vLLM is not installed; an installed vLLM
that is broken or too old raises its own error instead of a silent transformers run."""

from __future__ import annotations

import importlib.util
import logging
import os
import subprocess
import sys
import textwrap

import pytest

from rllib_grpo.models import resolve_model
from rllib_grpo.samplers import make_sampler
from rllib_grpo.samplers.hf import HFSampler
from rllib_grpo.samplers.vllm_weights import MIN_VLLM

pytestmark = pytest.mark.processes

@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


def test_auto_samples_with_transformers_where_vllm_is_not_installed(model_path, monkeypatch,
                                                                     caplog):
    """The choice is vLLM's spec, not whether an import fails: here the spec is gone (vLLM
    itself still imports), so no vLLM sampler is even tried."""
    from rllib_grpo.samplers import vllm as vllm_sampler

    def tried(*args, **kwargs):
        raise AssertionError("a vLLM sampler was tried where vLLM is not installed")

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real_find_spec(name, *a))
    monkeypatch.setattr(vllm_sampler, "VLLMSampler", tried)
    with caplog.at_level(logging.WARNING, logger="rllib_grpo.samplers"):
        sampler = make_sampler("auto", model_path=model_path, gpu_memory_utilization=0.3)
    assert isinstance(sampler, HFSampler)
    assert [r.getMessage() for r in caplog.records] == [
        "vLLM is not installed: sampling with transformers "
        "(pip install 'rllib-grpo[vllm]' for vLLM)"]


def _auto_sampler_with_fake_vllm(tmp_path, model_path, vllm_init: str
                                 ) -> subprocess.CompletedProcess:
    """``make_sampler("auto")`` in a fresh interpreter whose ``vllm`` is a package of
    ``vllm_init`` (installed: it has a spec), first on ``sys.path``."""
    package = tmp_path / "site" / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(vllm_init))
    code = ("from rllib_grpo.samplers import make_sampler\n"
            f"sampler = make_sampler('auto', model_path={str(model_path)!r})\n"
            "print('sampler:', type(sampler).__name__)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path / "site"), os.getcwd(), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)


def test_auto_raises_the_error_of_an_installed_vllm_that_does_not_import(tmp_path, model_path):
    run = _auto_sampler_with_fake_vllm(tmp_path, model_path, """
        raise ImportError("libcudart.so.12: cannot open shared object file")
    """)
    assert run.returncode != 0, run.stdout
    assert "sampler:" not in run.stdout
    assert "ImportError: libcudart.so.12: cannot open shared object file" in run.stderr


def test_auto_refuses_an_installed_vllm_too_old_naming_the_floor(tmp_path, model_path):
    run = _auto_sampler_with_fake_vllm(tmp_path, model_path, """
        __version__ = "0.27.1"
    """)
    assert run.returncode != 0, run.stdout
    assert "sampler:" not in run.stdout
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: vLLM 0.27.1 lacks the weight-transfer modules"), last
    assert f"install vllm>={MIN_VLLM}" in last
