"""LoRA through peft on the tiny model: training, reference, weight sync, checkpoints."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import tiny_config

LORA = {"lora_rank": 4, "lora_alpha": 8, "lr": 1e-2}


def _module(**training):
    """A learner-side `CausalLMRLModule` built from a tiny config (no Ray)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.learner.module import CausalLMRLModule

    config = tiny_config(**training)
    return RLModuleSpec(module_class=CausalLMRLModule, observation_space=TEXT_SPACE,
                        action_space=TEXT_SPACE, model_config=config.module_config()).build()


def _base_model():
    from rllib_grpo.models import load_causal_lm, resolve_model

    return load_causal_lm(resolve_model("builtin:tiny"))


def _perturb_adapter(module, seed: int = 0) -> None:
    """Give the adapter a non-zero update (B starts at zero), as training would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.lm.named_parameters():
            if "lora_B" in name:
                param.copy_(0.05 * torch.randn(param.shape, generator=generator))


def _merged_state(module) -> dict[str, torch.Tensor]:
    """The learner's policy as plain HF weights, merged by peft itself."""
    return copy.deepcopy(module.lm).merge_and_unload().state_dict()


def _forward_batch(rollout) -> dict[str, torch.Tensor]:
    columns = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    return {k: torch.as_tensor(getattr(rollout, k)) for k in columns}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


# --------------------------------------------------------------------------- GRPO runs
def test_grpo_with_lora_trains_the_adapter_only_and_syncs_it(ray_session, tmp_path):
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.models.lora import base_state_dict
    from rllib_grpo.rllib.algorithm.grpo import GRPO
    from rllib_grpo.rllib.learner.module import response_log_probs

    algo = tiny_config(**LORA).build_algo()
    try:
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
        assert module.ref_lm is None  # the reference is the policy minus its adapter
        trainable = [n for n, p in module.named_parameters() if p.requires_grad]
        assert trainable and all(".lora_" in n for n in trainable)
        full = algo.env_runner.last_weight_sync  # the sync at build: base weights + adapter
        assert full["kind"] == "full"
        for _ in range(2):
            result = algo.train()
        adapter = algo.env_runner.last_weight_sync
        assert adapter["kind"] == "adapter"
        assert result["env_runners"]["weight_sync/bytes"] == adapter["bytes"]
        print(f"\nLoRA r=4 on builtin:tiny: full sync {full['bytes']} bytes, adapter sync "
              f"{adapter['bytes']} bytes ({full['bytes'] / adapter['bytes']:.1f}x), "
              f"loaded into the sampler {adapter['loaded_bytes']} bytes")
        assert full["bytes"] > 8 * adapter["bytes"]

        # The sampler holds exactly the merged policy; the base weights never moved.
        merged = _merged_state(module)
        sampler_state = algo.env_runner.sampler.model.state_dict()
        assert _max_diff(merged, sampler_state) < 1e-5
        base = _base_model()
        assert _max_diff(base.state_dict(), base_state_dict(module.lm)) == 0.0

        # Reference log-probs are the base model's; the policy's are not.
        batch = _forward_batch(algo.last_rollout)
        ref = module.reference_log_probs(batch)
        with torch.no_grad():
            base_lp = response_log_probs(base, batch, 1.0)["log_probs"]
            policy_lp = response_log_probs(module.lm, batch, 1.0)["log_probs"]
        mask = batch["response_mask"].bool()
        assert (ref - base_lp)[mask].abs().max().item() < 1e-6
        assert (policy_lp - base_lp)[mask].abs().max().item() > 1e-4

        path = algo.save_to_path(str(tmp_path / "ckpt"))
        adapter_before = module.get_state()["lora_adapter"]
    finally:
        algo.stop()
    _check_restored(GRPO, path, adapter_before, batch, policy_lp)


def test_remote_env_runner_merges_adapter_syncs(ray_session):
    config = tiny_config(**LORA, lora_sync="merged")
    config.env_runners(num_env_runners=1, create_local_env_runner=False)
    algo = config.build_algo()
    try:
        def last_sync():
            return algo.env_runner_group.foreach_env_runner(
                lambda er: er.last_weight_sync, local_env_runner=False)[0]

        assert last_sync()["kind"] == "full"
        algo.train()
        assert last_sync()["kind"] == "merged"
        result = algo.train()  # sampled with the merged weights of the first update
        assert result["training/rollout_probs_diff_max"] < 1e-5
    finally:
        algo.stop()


def test_a_payload_travels_as_named_tensors_and_is_rebuilt_whole():
    from rllib_grpo.models.lora import SYNC_KIND, LoRAPayload

    payload = LoRAPayload("full", {"model.norm.weight": torch.ones(3)},
                          {"model.layers.0.mlp.up_proj": (torch.zeros(2, 3), torch.ones(4, 2))},
                          scaling=2.0)
    tensors, meta = payload.to_tensors(), payload.sync_meta()
    assert meta[SYNC_KIND] == "full"
    rebuilt = LoRAPayload.from_tensors(tensors, meta)
    assert (rebuilt.kind, rebuilt.scaling) == ("full", 2.0)
    assert rebuilt.weights.keys() == payload.weights.keys()
    assert rebuilt.adapter.keys() == payload.adapter.keys()
    (a, b), (a0, b0) = rebuilt.adapter["model.layers.0.mlp.up_proj"], \
        payload.adapter["model.layers.0.mlp.up_proj"]
    assert torch.equal(a, a0) and torch.equal(b, b0)


def _check_restored(GRPO, path, adapter_before, batch, policy_lp) -> None:
    """The checkpoint holds the adapter alone and restores the identical policy."""
    import pickle
    from pathlib import Path

    from peft import PeftModel
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.learner.module import response_log_probs

    module_dir = Path(path, "learner_group", "learner", "rl_module", DEFAULT_MODULE_ID)
    state = pickle.loads((module_dir / "module_state.pkl").read_bytes())
    assert set(state) == {"lora_adapter", "base_model", "lora"}
    assert state["base_model"] == "builtin:tiny"
    assert all(".lora_" in k for k in state["lora_adapter"])
    restored = GRPO.from_checkpoint(path)
    try:
        module = restored.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
        after = module.get_state()["lora_adapter"]
        assert all(torch.equal(after[k], v) for k, v in adapter_before.items())
        with torch.no_grad():
            restored_lp = response_log_probs(module.lm, batch, 1.0)["log_probs"]
        assert torch.equal(restored_lp, policy_lp)
        # The runner got the restored policy too.
        assert _max_diff(_merged_state(module),
                         restored.env_runner.sampler.model.state_dict()) < 1e-5
    finally:
        restored.stop()
    # The PEFT-format copy loads with peft alone onto the base model.
    peft_lm = PeftModel.from_pretrained(_base_model(), str(module_dir / "adapter")).eval()
    with torch.no_grad():
        peft_lp = response_log_probs(peft_lm, batch, 1.0)["log_probs"]
    assert (peft_lp - policy_lp).abs().max().item() < 1e-6


# --------------------------------------------------------------------------- sync, no Ray
@pytest.mark.parametrize("mode", ["adapter", "merged"])
def test_sync_payloads_merge_into_the_hf_sampler(mode):
    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.lora import AdapterMerger
    from rllib_grpo.samplers import make_sampler

    module = _module(**LORA, lora_sync=mode, lora_target_modules=["q_proj", "down_proj"])
    path = resolve_model("builtin:tiny")
    sampler, merger = make_sampler("hf", model_path=path), AdapterMerger(path)
    first = module.get_state(inference_only=True)
    assert first.kind == "full" and merger.apply(sampler, first)["kind"] == "full"
    _perturb_adapter(module)
    payload = module.get_state(inference_only=True)
    stats = merger.apply(sampler, payload)
    assert stats["kind"] == mode and stats["bytes"] == payload.nbytes()
    assert _max_diff(_merged_state(module), sampler.model.state_dict()) < 1e-5
    if mode == "merged":  # q_proj brings its fused siblings k_proj and v_proj
        assert any(k.endswith("k_proj.weight") for k in payload.weights)


def test_a_runner_without_the_first_sync_reads_its_base_from_disk():
    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.lora import AdapterMerger
    from rllib_grpo.samplers import make_sampler

    module = _module(**LORA)
    module.get_state(inference_only=True)  # the full sync went elsewhere
    _perturb_adapter(module, seed=1)
    path = resolve_model("builtin:tiny")
    sampler = make_sampler("hf", model_path=path)
    AdapterMerger(path).apply(sampler, module.get_state(inference_only=True))
    assert _max_diff(_merged_state(module), sampler.model.state_dict()) < 1e-5


@pytest.mark.vllm
def test_adapter_sync_into_vllm_matches_the_merged_policy():
    """vLLM-CPU repacks linear weights, so the check is on log-probs (1e-4, as for full syncs)."""
    from rllib_grpo.models import build_char_tokenizer, resolve_model
    from rllib_grpo.models.lora import AdapterMerger
    from rllib_grpo.samplers import SamplingParams, make_sampler
    from tests.helpers.log_probs import max_log_prob_diff, mean_log_prob

    module = _module(**LORA, lora_target_modules=["q_proj", "gate_proj", "o_proj"])
    path = resolve_model("builtin:tiny")
    sampler = make_sampler("vllm", model_path=path, seed=0, kv_cache_space_gb=1)
    try:
        merger = AdapterMerger(path)
        merger.apply(sampler, module.get_state(inference_only=True))
        _perturb_adapter(module, seed=2)
        stats = merger.apply(sampler, module.get_state(inference_only=True))
        assert stats["kind"] == "adapter"
        merged = copy.deepcopy(module.lm).merge_and_unload()
        prompts = [build_char_tokenizer().encode(t) for t in ("3+4=", "12*5=", "7-")]
        params = SamplingParams(temperature=1.0, max_tokens=12, seed=3)
        groups = sampler.generate(prompts, 4, params)
        assert mean_log_prob(groups) < -0.5
        assert max_log_prob_diff(merged, prompts, groups, params) < 1e-4
        # A partial reload must not leave a fused vLLM layer half loaded.
        q_only = {k: v for k, v in merged.state_dict().items() if k.endswith("q_proj.weight")}
        with pytest.raises(KeyError, match="k_proj"):
            sampler.load_weights(q_only, partial=True)
    finally:
        sampler.close()


# --------------------------------------------------------------------------- module levers
def test_reference_offload_keeps_the_reference_out_of_the_module():
    plain, offloaded = _module(), _module(ref_param_offload=True)
    assert offloaded.ref_lm is None and offloaded._host_ref is not None
    count = sum(p.numel() for p in plain.lm.parameters())
    assert sum(p.numel() for p in offloaded.parameters()) == count  # the policy alone
    batch = {"prompt_ids": torch.tensor([[5, 6, 7]]), "prompt_mask": torch.ones(1, 3),
             "response_ids": torch.tensor([[8, 9]]), "response_mask": torch.ones(1, 2)}
    assert torch.equal(plain.reference_log_probs(batch), offloaded.reference_log_probs(batch))


def test_lora_dropout_only_in_the_training_forward():
    module = _module(**LORA, lora_dropout=0.5)
    _perturb_adapter(module)
    batch = {"prompt_ids": torch.tensor([[5, 6, 7]]), "prompt_mask": torch.ones(1, 3),
             "response_ids": torch.tensor([[8, 9, 10]]), "response_mask": torch.ones(1, 3)}
    torch.manual_seed(0)
    train = [module.forward_train(batch)["log_probs"] for _ in range(2)]  # RLlib: train mode
    assert not torch.equal(train[0], train[1])
    assert module.training  # as RLlib leaves it: the no-grad passes must still be exact
    from rllib_grpo.rllib.learner.module import response_log_probs

    with torch.no_grad():
        old = [response_log_probs(module.lm, batch, 1.0)["log_probs"] for _ in range(2)]
        # The module's own forward runs on packed rows (use_remove_padding): compared with
        # the same pass, as packed and padded rows may differ in the last float32 bit
        # (they did, with one thread: tests/rllib/learner/test_packing.py bounds that difference).
        packed = response_log_probs(module.lm, batch, 1.0, packed=module.packed)["log_probs"]
    assert torch.equal(old[0], old[1])
    assert torch.equal(module._forward(batch)["log_probs"], packed)


def test_lora_settings_are_checked():
    from rllib_grpo.rllib.config.checks import find_errors, find_pitfalls

    def errors(**training):
        return " ".join(find_errors(tiny_config(**training)))

    assert "lora_sync='both' is unknown" in errors(lora_rank=4, lora_sync="both")
    assert "lora_alpha=0 must be > 0" in errors(lora_rank=4, lora_alpha=0)
    assert "lora_rank=-1" in errors(lora_rank=-1)
    assert "set fsdp=False" in " ".join(find_errors(tiny_config(lora_rank=4).learners(
        num_learners=2)))
    assert "sampler_memory_fraction=1.5" in errors(sampler_memory_fraction=1.5)
    pitfalls = " ".join(find_pitfalls(tiny_config(lora_rank=4, lr=1e-6, ref_param_offload=True)))
    assert "order of magnitude" in pitfalls and "ref_param_offload=True does nothing" in pitfalls
    assert find_pitfalls(tiny_config(optimizer_offload=True)) == []  # the learner applies it
    text = tiny_config(**LORA).explain()
    assert "LoRA: rank 4, alpha 8" in text and "No pitfalls found." in text
