"""The pre-flight memory plan: the shapes it reads without weights, its rows against a hand
computation and against what autograd saves, the errors that refuse a GPU run that would
run out of memory, and verl's Qwen3-8B line planned offline."""

from __future__ import annotations

import functools

import pytest
import torch

from tests.conftest import tiny_config

GIB = 2**30
# builtin:tiny: hidden 64, 2 layers, 2 heads of 32, 1 KV head, MLP 128, vocab 18, tied.
H, L, HEADS, HEAD_DIM, KV_HEADS, MLP, VOCAB = 64, 2, 2, 32, 1, 128, 18


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """The plans here come from config.json files and the built-in table: no network."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _qwen05b_on_one_gpu(**training):
    """verl-sized Qwen2.5-0.5B on one GPU, learner and vLLM engine in one process (the
    README's one-GPU recipe), at the package's defaults otherwise: 16 prompts x 8,
    512 + 512 tokens."""
    from rllib_grpo.rllib.config.grpo_config import GRPOConfig

    config = GRPOConfig().training(model_path="Qwen/Qwen2.5-0.5B-Instruct", sampler="vllm",
                                   **training)
    return config.learners(num_learners=0, num_gpus_per_learner=1)


OLD_GPU_DEFAULTS = {"use_dynamic_bsz": False, "token_stats": "full",
                    "gradient_checkpointing": False}


# --------------------------------------------------------------------------- shapes
def test_the_shape_table_gives_the_published_parameter_counts_without_weights():
    from rllib_grpo.models.shapes import KNOWN_SHAPES, model_shape

    # The models' cards: Qwen2.5-0.5B 494,032,768; Qwen3-8B 8.19B; Llama-3-8B 8,030,261,248;
    # Llama-3.1-70B 70,553,706,496 (instruct variants share the base's shape).
    assert model_shape("Qwen/Qwen2.5-0.5B-Instruct").num_params == 494_032_768
    assert model_shape("Qwen/Qwen3-8B").num_params == 8_190_735_360
    assert model_shape("meta-llama/Meta-Llama-3-8B-Instruct").num_params == 8_030_261_248
    assert model_shape("meta-llama/Llama-3.1-70B-Instruct").num_params == 70_553_706_496
    qwen3 = model_shape("Qwen/Qwen3-8B")
    assert (qwen3.hidden_size, qwen3.num_layers, qwen3.vocab_size, qwen3.kv_width) == (
        4096, 36, 151_936, 8 * 128)
    assert qwen3.qk_norm and "huggingface.co/Qwen/Qwen3-8B" in qwen3.source
    assert {"Qwen/Qwen2.5-72B", "Qwen/Qwen3-0.6B", "Qwen/Qwen3-32B",
            "meta-llama/Meta-Llama-3-70B"} <= set(KNOWN_SHAPES)
    assert all(entry["source"].startswith("https://huggingface.co/")
               for entry in KNOWN_SHAPES.values())
    with pytest.raises(ValueError, match="KNOWN_SHAPES"):
        model_shape("nobody/no-such-model-here")


def test_a_folders_config_json_comes_before_the_table(tmp_path):
    """A local folder named like a table entry is read from its own config.json."""
    import shutil

    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.shapes import model_shape

    folder = tmp_path / "Qwen3-8B"
    shutil.copytree(resolve_model("builtin:tiny"), folder)
    shape = model_shape(str(folder))
    assert (shape.hidden_size, shape.num_layers, shape.vocab_size) == (H, L, VOCAB)
    assert shape.source == "Qwen3-8B/config.json"


def test_explain_prints_a_cpu_learners_plan_or_why_there_is_none():
    text = tiny_config().explain()
    assert "memory plan: 0.0752M params (2 layers x 64 hidden, vocab 18; shape from tiny-" in text
    assert "CPU (host memory): MiB by phase" in text and "main process (learner)" in text
    assert "memory plan: unavailable (ValueError: no shape for 'nobody/no-such-model-here'" \
        in tiny_config(model_path="nobody/no-such-model-here").explain()


# --------------------------------------------------------------------------- the rows
def _tiny_on_two_gpus():
    """builtin:tiny in verl's colocated layout on 2 GPUs of 16 GiB: two FSDP2 ranks, each
    beside a vLLM engine of TP 1; bf16 compute over fp32 master weights (the GPU default)."""
    config = tiny_config(sampler="vllm", gpu_memory_gib=16)
    return config.colocate(2)


def test_a_gpus_rows_match_a_hand_computation():
    """GPU 0 of `_tiny_on_two_gpus`, every row derived here from the model's shape and
    what each process holds (tiny_config: 4 prompts x 4, 16 + 4 tokens, KL loss)."""
    from rllib_grpo.rllib.config.memory import memory_plan

    config = _tiny_on_two_gpus()
    plan = memory_plan(config)
    (device,) = plan.devices  # both GPUs hold the same: one table
    assert device.gpus == ["node 0 GPU 0", "node 0 GPU 1"]
    learner, engine = device.processes
    params = 18 * 64 + 64 + L * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 128 + 2 * 64)
    assert plan.shape.num_params == params == 75_200
    context = GIB // 2
    weights, grads, adam = params * 4 / 2, params * 4 / 2, 2 * params * 4 / 2  # fp32, 1/2
    reference = params * 2 / 2  # bf16, 1/2
    # Between steps no gradients: the learner drops them before the engines wake.
    resident = {"CUDA context": context, "weights": weights, "gradients": 0.0,
                "AdamW": adam, "reference": reference}
    assert learner.phases["sample"] == learner.phases["asleep"] == resident
    # Build: the shard, and rank 0's rows of one tensor for the other rank (the largest,
    # gate/up: half of 64 x 128, fp32) on their way.
    assert learner.phases["build"] == {"CUDA context": context, "weights": weights,
                                       "reference": reference,
                                       "loading (one rank's rows)": 64 * 128 * 4 / 2}
    # The update: 8 trajectories per learner, all in one micro-batch of 8 x 20 = 160
    # tokens (token budget 16384), 8 x 4 = 32 response logits.  Per token and layer, what
    # autograd keeps in bf16 (FSDP2 computes in bf16; norms upcast to fp32):
    saved_per_layer = sum([
        4 * H, 2 * H, 2 * H,  # input norm: fp32 input, normalised, output (q/k/v's input)
        2 * HEADS * HEAD_DIM, 2 * KV_HEADS * HEAD_DIM, 2 * KV_HEADS * HEAD_DIM,  # q, k, v
        2 * HEADS * HEAD_DIM, 4 * HEADS,  # attention output, log-sum-exp
        4 * H, 2 * H, 2 * H,  # post-attention norm
        4 * 2 * MLP,  # gate, up, SiLU, product
    ])
    assert saved_per_layer == 2440
    final_norm = (4 + 2 + 2) * H
    # Checkpointing (on: 160 x (2 x 2440 + 512) bytes outweigh the 601,600 of weights,
    # gradients and AdamW): each layer's bf16 input, one layer's activations, the final norm.
    assert 160 * (L * saved_per_layer + final_norm) > weights + grads + adam
    activations = 160 * (L * 2 * H + saved_per_layer + final_norm)
    gathered = (64 * 18 + 64 + 2 * 36_992) * 2 + (64 * 18 + 64 + 36_992) * 2  # root + layers
    head_grads = 64 * 128 * 4 / 2  # the largest gradient, before the rest exist
    backward_temporaries = 160 * (3 * 2 * MLP + 2 * 2 * H)  # a layer's MLP + stream grads
    assert learner.phases["update"] == {
        "CUDA context": context, "weights": weights, "gradients": head_grads, "AdamW": adam,
        "reference": reference, "gathered (compute dtype)": gathered,
        "activations": activations, "backward temporaries": backward_temporaries}
    # The engine: half the GPU awake (colocated default), its context alone asleep, its
    # bf16 weights alone from the weights-first wake through the sync.
    share = 0.5 * 16 * GIB
    awake = {"CUDA context": context, "vLLM weights": params * 2,
             "KV cache, CUDA graphs, activations": share - params * 2}
    assert engine.phases["sample"] == engine.phases["build"] == awake
    assert engine.phases["update"] == engine.phases["asleep"] == {"CUDA context": context}
    assert engine.phases["wake"] == engine.phases["sync"] == {"CUDA context": context,
                                                              "vLLM weights": params * 2}
    assert device.total("sample") == sum(resident.values()) + share + context
    assert learner.total("update") > weights + grads + adam + reference  # AdamW's step


def _saved_bytes(lm: torch.nn.Module, forward) -> int:
    """Bytes of the floating-point tensors ``forward()`` saves for backward, other than
    ``lm``'s parameters (each storage once)."""
    params = {p.untyped_storage().data_ptr() for p in lm.parameters()}
    saved: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params and t.is_floating_point():
            saved[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        forward()
    return sum(saved.values())


def test_activations_are_what_autograd_saves():
    """The activation row against the bytes a real forward's graph keeps (CPU, fp32),
    one sequence per row and shared prompts (a dense mask: keys and values repeated)."""
    from rllib_grpo.models import load_causal_lm, resolve_model
    from rllib_grpo.models.packing import packed_response_log_probs
    from rllib_grpo.models.shared_prefix import shared_prefix_layout
    from rllib_grpo.rllib.config.learner_memory import (
        activation_bytes,
        config_shape,
        micro_batch,
    )

    lm = load_causal_lm(resolve_model("builtin:tiny"))
    for group, prompt, response in ((1, 32, 64), (4, 40, 8)):
        config = tiny_config(prompts_per_step=8, group_size=group, max_prompt_length=prompt,
                             max_response_length=response)
        shape = config_shape(config)
        mb = micro_batch(config, shape)
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(4, VOCAB, (8, prompt), generator=generator)
        batch = {"prompt_ids": prompts.repeat_interleave(group, 0),
                 "prompt_mask": torch.ones(8 * group, prompt, dtype=torch.long),
                 "response_ids": torch.randint(4, VOCAB, (8 * group, response),
                                               generator=generator),
                 "response_mask": torch.ones(8 * group, response)}
        layout = shared_prefix_layout(lm, batch) if group > 1 else None
        saved = _saved_bytes(lm, functools.partial(packed_response_log_probs, lm, batch,
                                                   1.0, layout=layout))
        logits = mb.logit_rows * VOCAB * 4  # the float32 response logits the loss keeps
        rotary = 2 * mb.slots * HEAD_DIM * 4  # cos and sin, shared by the layers
        measured = saved - logits - rotary
        predicted = activation_bytes(config, shape, mb, checkpointing=False)
        assert mb.masked_attention == (group > 1)
        assert abs(predicted - measured) <= 0.03 * measured, (group, predicted, measured)


def test_the_engines_share_is_the_one_their_options_give_vllm():
    from rllib_grpo.rllib.config.memory import VLLM_DEFAULT_MEMORY_FRACTION, engine_memory_fraction
    from rllib_grpo.rllib.env_runner.engine import engine_options

    colocated = tiny_config(sampler="vllm").colocate(2)
    fractional = tiny_config(sampler="vllm").learners(num_learners=1, num_gpus_per_learner=1)
    fractional.env_runners(num_env_runners=2, num_gpus_per_env_runner=0.4)
    own_gpus = tiny_config(sampler="vllm").learners(num_learners=1, num_gpus_per_learner=1)
    own_gpus.env_runners(num_env_runners=1, num_gpus_per_env_runner=1)
    asked = tiny_config(sampler="vllm", sampler_memory_fraction=0.7).colocate(2)
    for config, share in ((colocated, 0.5), (fractional, 0.36), (asked, 0.7)):
        assert engine_memory_fraction(config) == share
        assert engine_options(config)["gpu_memory_utilization"] == share
    assert "gpu_memory_utilization" not in engine_options(own_gpus)  # vLLM's own default
    assert engine_memory_fraction(own_gpus) == VLLM_DEFAULT_MEMORY_FRACTION


# --------------------------------------------------------------------------- GPU defaults
def test_the_old_gpu_defaults_run_qwen05b_out_of_memory_and_are_refused_with_the_knobs():
    from rllib_grpo.rllib.config.checks import find_errors

    config = _qwen05b_on_one_gpu(**OLD_GPU_DEFAULTS)
    errors = [e for e in find_errors(config) if "runs out of memory" in e]
    (error,) = [e for e in errors if "in phase 'update'" in e]
    assert error.startswith("the main process's GPU runs out of memory in phase 'update'")
    assert "of 79.2 GiB (gpu_memory_gib); largest: activations" in error
    for knob in ("gradient_checkpointing=True", "use_dynamic_bsz=True with "
                 "max_tokens_per_micro_batch", "token_stats='auto'"):
        assert knob in error, knob
    with pytest.raises(ValueError, match="runs out of memory"):
        config.validate()


def test_the_gpu_defaults_fit_qwen05b_on_one_gpu_and_keep_the_cpu_defaults():
    from rllib_grpo.rllib.config.checks import find_errors
    from rllib_grpo.rllib.config.memory import PHASES, memory_plan

    config = _qwen05b_on_one_gpu()
    assert (config.micro_batches_by_tokens, config.learner_token_stats,
            config.checkpoints_activations) == (True, "auto", True)
    assert not [e for e in find_errors(config) if "runs out of memory" in e]
    plan = memory_plan(config)
    assert all(device.total(phase) <= 79.2 * GIB for device in plan.devices
               for phase in PHASES)
    assert config.module_config()["token_stats"] == "auto"
    assert config.module_config()["gradient_checkpointing"] is True
    text = config.explain()
    assert ("learner memory settings:       GPU learners (num_gpus_per_learner > 0): "
            "use_dynamic_bsz=True (default), token_stats='auto' (default), "
            "gradient_checkpointing=True (default)") in text
    cpu = tiny_config()
    assert (cpu.micro_batches_by_tokens, cpu.learner_token_stats,
            cpu.checkpoints_activations) == (False, "full", False)
    assert cpu.module_config()["token_stats"] == "full"
    # A fixed micro-batch size asked for on GPUs is kept (no token budget over it).
    fixed = _qwen05b_on_one_gpu(micro_batch_size_per_learner=8)
    assert not fixed.micro_batches_by_tokens


def test_rllib_train_refuses_an_out_of_memory_plan_before_ray_starts(capsys, monkeypatch):
    from rllib_grpo.cli import run
    from rllib_grpo.cli.main import main

    def no_ray(*_):
        raise AssertionError("Ray was started before the refusal")

    monkeypatch.setattr(run, "_init_ray", no_ray)  # other tests may hold a Ray session here

    code = main(["train", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
                 "actor_rollout_ref.rollout.name=vllm", "num_gpus_per_learner=1",
                 "actor_rollout_ref.actor.use_dynamic_bsz=False", "token_stats=full",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=False",
                 "data.train_batch_size=16", "actor_rollout_ref.rollout.n=8",
                 "actor_rollout_ref.actor.ppo_mini_batch_size=16"])
    assert code == 2
    err = capsys.readouterr().err
    assert "runs out of memory in phase 'update'" in err and "gradient_checkpointing=True" in err


def test_explain_takes_the_gpu_memory_and_names_what_else_fixes_it(capsys):
    from rllib_grpo.cli.main import main

    # A 7B model on one 24 GiB GPU: its fp32 states alone do not fit.
    main(["explain", "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
          "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.n=8",
          "num_gpus_per_learner=1", "--gpu-memory", "24"])
    out = capsys.readouterr().out
    assert "GPUs of 24 GiB (gpu_memory_gib)" in out
    assert "runs out of memory" in out and "optimizer_offload=True" in out
    assert "more GPUs (FSDP2 shards" in out


# --------------------------------------------------------------------------- verl's line
def _verl_qwen3_8b(tmp_path):
    from rllib_grpo.cli.build import build_config
    from rllib_grpo.cli.main import assemble_from_args, build_parser
    from tests.helpers.verl_scripts import script_overrides

    _, overrides = script_overrides("run_qwen3_8b_fsdp.sh", tmp_path)
    return build_config(assemble_from_args(build_parser().parse_args(["explain"]), None,
                                           overrides))


def test_explain_plans_verls_qwen3_8b_line_offline(tmp_path):
    """8 x 80 GB, TP 2, gpu_memory_utilization 0.6, reference offloaded, token budget
    24576: one table for the 8 alike GPUs, a learner rank and an engine shard on each,
    every phase within the GPU."""
    from rllib_grpo.rllib.config.memory import PHASES, memory_errors, memory_plan

    config = _verl_qwen3_8b(tmp_path)
    text = config.explain()
    assert "memory plan: unavailable" not in text
    assert "memory plan: 8.19B params (36 layers x 4096 hidden, vocab 151936; shape from " \
           "built-in table (Qwen/Qwen3-8B" in text
    assert "node 0 GPUs 0-7 (alike): GiB by phase" in text
    for row in ("learner (a rank)", "weights (fp32, 1/8)", "AdamW states (fp32, 1/8)",
                "FSDP2 gathered (bf16)", "vLLM engine shard (TP 2)",
                "vLLM weights (bf16, 1/2)", "KV cache, CUDA graphs, activations", "free"):
        assert row in text, row
    assert memory_errors(config) == []
    (device,) = memory_plan(config).devices
    assert len(device.gpus) == 8
    engine = device.processes[1]
    assert engine.total("sample") == pytest.approx(0.6 * 79.2 * GIB + GIB / 2)
    assert max(device.total(phase) for phase in PHASES) < 79.2 * GIB
    # On 30 GiB GPUs the engines' 60% and the learner's state do not fit while sampling,
    # nor the update's token budget.
    config.training(gpu_memory_gib=30)
    sample, update = memory_errors(config)
    assert sample.startswith("node 0 GPUs 0-7 runs out of memory in phase 'sample'")
    assert "a lower gpu_memory_utilization (sampler_memory_fraction)" in sample
    assert update.startswith("node 0 GPUs 0-7 runs out of memory in phase 'update'")
    assert "a smaller max_tokens_per_micro_batch" in update
