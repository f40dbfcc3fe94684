"""verl's Qwen2.5-VL Geo3K GRPO command line (tests/fixtures/verl/run_qwen2_5_vl-7b.sh):
`explain` maps every key (tests/cli/test_verl_scripts.py checks the plan), states the image
tokens per prompt and refuses images with a text-only model in one line; and two training
steps of ``rllib train`` run from its keys on a Geo3K-shaped file with the tiny VLM.

The run keeps the script's keys but sizes (batch, lengths, steps) and the model, and takes
the transformers sampler without the script's vLLM engine keys: on this CPU machine vLLM
cannot run a Qwen2-VL (`rllib_grpo.samplers.vllm_vision`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rllib_grpo.cli.main import main
from tests.helpers.images import write_geo3k_parquet
from tests.helpers.verl_scripts import script_overrides

SCRIPT = "run_qwen2_5_vl-7b.sh"
# The script's keys this CPU run sets otherwise: sizes, the model, the sampler.
CPU_RUN = {
    "data.train_batch_size": "2", "actor_rollout_ref.rollout.n": "2",
    "actor_rollout_ref.actor.ppo_mini_batch_size": "2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "2",
    "data.max_prompt_length": "400", "data.max_response_length": "4",
    "actor_rollout_ref.model.path": "builtin:tiny-vlm",
    "actor_rollout_ref.rollout.name": "hf", "trainer.logger": "[console]",
}
# vLLM engine and GPU layout keys, which a transformers sampler on CPU does not take.
VLLM_AND_GPU_KEYS = (
    "actor_rollout_ref.rollout.tensor_model_parallel_size",
    "actor_rollout_ref.rollout.gpu_memory_utilization",
    "actor_rollout_ref.rollout.enable_chunked_prefill",
    "actor_rollout_ref.rollout.enforce_eager",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache",
    "trainer.n_gpus_per_node", "trainer.nnodes",
)


def cpu_overrides(tmp_path) -> list[str]:
    """The script's overrides for a CPU run on Geo3K-shaped files in ``tmp_path``."""
    _, args = script_overrides(SCRIPT, tmp_path)
    train = write_geo3k_parquet(tmp_path / "train.parquet", n=6)
    test = write_geo3k_parquet(tmp_path / "test.parquet", n=2, split="test")
    replaced = {**CPU_RUN, "data.train_files": str(train), "data.val_files": str(test)}
    out = []
    for arg in args:
        key = arg.partition("=")[0]
        if key in VLLM_AND_GPU_KEYS:
            continue
        out.append(f"{key}={replaced.pop(key)}" if key in replaced else arg)
    assert not replaced, replaced  # every replaced key is the script's own
    return out


def test_explain_states_image_tokens_and_refuses_a_text_only_model(tmp_path, capsys):
    from rllib_grpo.models import resolve_model

    resolve_model("builtin:tiny-vlm")  # the door measures prompts of a model at hand
    args = cpu_overrides(tmp_path)
    code = main(["explain", *args], prog="rllib-grpo")
    out = capsys.readouterr().out
    assert code == 0, out
    assert "verl key mapped: data.image_key -> env_config.image_key" in out
    assert "stop: {'training_iteration': 45}" in out  # 15 epochs x 6 prompts // 2 per step
    # Geo3K-shaped 40x30 figures, scaled to the tiny VLM's 84 x 84 pixels: 84 x 112 (x 28).
    assert ("images:                        12-12 image tokens per prompt (mean 12), inside "
            "max_prompt_length=400") in out
    assert "vision activations" in out  # the memory plan counts the vision tower
    text_model = [a.replace("builtin:tiny-vlm", "builtin:tiny") for a in args]
    assert main(["explain", *text_model], prog="rllib-grpo") == 1
    errors = [line for line in capsys.readouterr().out.splitlines()
              if "carry images" in line and line.startswith("  - ")]
    assert len(errors) == 1 and "model_path='builtin:demo-vlm'" in errors[0]


@pytest.mark.ray  # rllib train: its own Ray
def test_two_training_steps_of_verls_geo3k_command_line(tmp_path):
    args = [*cpu_overrides(tmp_path), "trainer.total_training_steps=2", "trainer.save_freq=-1",
            "trainer.default_local_dir=" + str(tmp_path / "runs"),
            "--num-cpus", "2", "--object-store-memory", str(300 * 1024**2)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", "rllib_grpo.cli.main", "train", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (result_file,) = (tmp_path / "runs").rglob("result.json")
    results = [json.loads(line) for line in result_file.read_text().splitlines()]
    assert [r["training_iteration"] for r in results] == [1, 2]
    assert all(r["prompt_length/mean"] > 12 for r in results)  # the image tokens are in
    assert "val-core/hiyouga/geometry3k/acc/mean@1" in results[0]  # verl's val_before_train


def test_a_text_model_on_geo3k_is_refused_before_ray_starts(tmp_path, capsys, monkeypatch):
    from rllib_grpo.cli import run

    def no_ray(*_):
        raise AssertionError("Ray was started before the refusal")

    monkeypatch.setattr(run, "_init_ray", no_ray)
    args = [a.replace("builtin:tiny-vlm", "builtin:tiny") for a in cpu_overrides(tmp_path)]
    code = main(["train", *args, "trainer.total_training_steps=2",  # no prompt count needed
                 "trainer.default_local_dir=" + str(tmp_path / "runs")],
                prog="rllib")
    err = capsys.readouterr().err
    assert code == 2, err
    (line,) = [line for line in err.splitlines() if "carry images" in line]
    assert "is a text-only model; use a vision-language model" in line
