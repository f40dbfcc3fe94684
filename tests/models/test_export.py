"""`rllib-grpo export` / `GRPO.export_model`: checkpoints out as Hugging Face model folders.

The round trip is judged on log-probs: the exported folder, loaded with
``AutoModelForCausalLM`` (or peft), scores the same responses as the learner did (the
same weights, the same computation: equal to 1e-6; a merged LoRA export, whose float32
merge rounds the weights, within a bound derived from that rounding, in float64); a
bfloat16 export equals the learner's weights cast to bfloat16, bit for bit.  Checkpoints come from a real 2-learner FSDP2 run and a
LoRA run on the tiny built-in model.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import EPS32, REPO_ROOT, float32_log_softmax_bound, tiny_config
from tests.helpers.learner_updates import learner_config

LORA = {"lora_rank": 4, "lora_alpha": 8, "lr": 1e-2}
ROOT = REPO_ROOT


def _forward_batch(rollout) -> dict[str, torch.Tensor]:
    columns = ("prompt_ids", "prompt_mask", "response_ids", "response_mask")
    return {k: torch.as_tensor(getattr(rollout, k)) for k in columns}


def _log_probs(lm, batch) -> torch.Tensor:
    from rllib_grpo.rllib.learner.module import response_log_probs

    with torch.no_grad():
        out = response_log_probs(lm, batch, 1.0)["log_probs"]
    return out.masked_fill(~batch["response_mask"].bool(), 0.0)


def _logit_scale(lm, batch) -> float:
    """max |logits| over the real positions (as `response_log_probs` runs them)."""
    ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1).long()
    attention = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = lm(input_ids=ids, attention_mask=attention, position_ids=positions).logits
    return logits[attention.bool()].abs().max().item()


def _load(folder, dtype=None):
    from transformers import AutoModelForCausalLM

    kwargs = {} if dtype is None else {"dtype": dtype}
    return AutoModelForCausalLM.from_pretrained(str(folder), **kwargs).eval()


# --------------------------------------------------------------------------- FSDP, 2 learners
@pytest.fixture(scope="module")
def fsdp_run(ray_session, tmp_path_factory):
    """A 2-learner FSDP2 run after one step: checkpoint, learner log-probs, full weights."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo = learner_config(2).build_algo()
    try:
        algo.train()
        batch = _forward_batch(algo.last_rollout)

        def learner_log_probs(learner):  # collective: every rank runs the sharded forward
            return _log_probs(learner.module[DEFAULT_MODULE_ID].unwrapped().lm, batch)

        group = algo.learner_group
        per_rank = group._get_results(group.foreach_learner(learner_log_probs))
        path = algo.save_to_path(str(tmp_path_factory.mktemp("fsdp") / "ckpt"))
        exported = algo.export_model(str(tmp_path_factory.mktemp("fsdp") / "live"))
        weights = group.get_weights()[DEFAULT_MODULE_ID]
    finally:
        algo.stop()
    assert torch.equal(per_rank[0], per_rank[1])
    return {"checkpoint": path, "batch": batch, "log_probs": per_rank[0], "weights": weights,
            "live_export": exported}


def test_fsdp_checkpoint_exports_the_learners_policy(fsdp_run, tmp_path):
    from rllib_grpo.cli.export_command import export_checkpoint

    batch, learner_lp = fsdp_run["batch"], fsdp_run["log_probs"]
    out = export_checkpoint(fsdp_run["checkpoint"], tmp_path / "fp32", max_shard_size="100KB")
    assert out.kind == "full" and out.dtype == "float32"
    files = {p.name for p in (tmp_path / "fp32").iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors.index.json",
            "tokenizer.json", "tokenizer_config.json"} <= files
    assert len([f for f in files if f.endswith(".safetensors")]) > 1  # sharded as asked
    exported = _load(tmp_path / "fp32")
    assert (_log_probs(exported, batch) - learner_lp).abs().max().item() <= 1e-6
    assert learner_lp.abs().max().item() > 0.1  # real log-probs, not all-zero padding
    # The weights are the trained ones, not the base model's.
    trained = exported.state_dict()
    assert max((trained[k] - v).abs().max().item() for k, v in fsdp_run["weights"].items()) == 0
    # The live algorithm exports the same weights as its checkpoint.
    live = _load(fsdp_run["live_export"]).state_dict()
    assert all(torch.equal(live[k], v) for k, v in trained.items())


def test_bf16_export_equals_the_learner_cast_to_bf16(fsdp_run, tmp_path):
    from rllib_grpo.cli.export_command import export_checkpoint

    batch = fsdp_run["batch"]
    export_checkpoint(fsdp_run["checkpoint"], tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    exported = _load(tmp_path / "bf16")
    assert next(exported.parameters()).dtype == torch.bfloat16
    # Every tensor is the learner's float32 weight rounded to bfloat16 ...
    state = exported.state_dict()
    assert all(torch.equal(state[k], v.to(torch.bfloat16)) for k, v in fsdp_run["weights"].items())
    # ... so it scores exactly as the learner's policy loaded in bfloat16 does.  (Not as
    # `.to(bfloat16)` of a float32 model: that also rounds the rotary inv_freq buffer.)
    export_checkpoint(fsdp_run["checkpoint"], tmp_path / "fp32")
    cast = _load(tmp_path / "fp32", dtype=torch.bfloat16)
    assert torch.equal(_log_probs(exported, batch), _log_probs(cast, batch))
    # ... and bf16 is a real rounding of the learner's float32 policy.
    assert (_log_probs(exported, batch) - fsdp_run["log_probs"]).abs().max().item() > 1e-6


def test_export_command_needs_no_ray(fsdp_run, tmp_path):
    """`rllib-grpo export` reads the checkpoint files alone: Ray is never imported."""
    code = ("import sys; from rllib_grpo.cli.main import main; "
            f"rc = main(['export', {fsdp_run['checkpoint']!r}, {str(tmp_path / 'm')!r}], "
            "prog='rllib-grpo'); assert 'ray' not in sys.modules, 'ray imported'; sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "exported model, float32" in done.stdout
    assert (tmp_path / "m" / "config.json").is_file()


# --------------------------------------------------------------------------- LoRA
@pytest.fixture(scope="module")
def lora_run(ray_session, tmp_path_factory):
    """A LoRA run after two steps (the adapter has moved): checkpoint and policy log-probs."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo = tiny_config(**LORA).build_algo()
    try:
        for _ in range(2):
            algo.train()
        module = algo.learner_group._learner.module[DEFAULT_MODULE_ID].unwrapped()
        batch = _forward_batch(algo.last_rollout)
        path = algo.save_to_path(str(tmp_path_factory.mktemp("lora") / "ckpt"))
        return {"checkpoint": path, "batch": batch, "log_probs": _log_probs(module.lm, batch),
                "policy64": copy.deepcopy(module.lm).double().eval()}
    finally:
        algo.stop()


def _merge_rounding(policy) -> dict[str, torch.Tensor]:
    """Elementwise bound on how far `lora.merge`'s float32 W + (B @ A)·s is from the exact
    merge, by exported name: the r-term products B @ A are within r·u·(|B| @ |A|) and the
    final addition within u·|W_merged| (u = eps32/2, Higham §3.1; ·s is exact, a power of
    two here); (r + 2)·u·s·(|B| @ |A|) + u·|W_merged| leaves room for second-order terms."""
    from peft.tuners.lora import LoraLayer

    u, bounds = EPS32 / 2, {}
    for name, layer in policy.named_modules():
        if not isinstance(layer, LoraLayer):
            continue
        a, b = layer.lora_A["default"].weight, layer.lora_B["default"].weight
        scaling, rank = layer.scaling["default"], a.shape[0]
        assert math.log2(scaling).is_integer()
        merged = layer.base_layer.weight + scaling * (b @ a)
        key = name.removeprefix("base_model.model.") + ".weight"
        bounds[key] = (rank + 2) * u * scaling * (b.abs() @ a.abs()) + u * merged.abs()
    assert bounds
    return bounds


def _weight_rounding_bound(model, batch, rounding: dict[str, torch.Tensor]) -> float:
    """First-order bound on how far ``model``'s log-probs move when its weights move by at
    most ``rounding`` (elementwise): max over response tokens t of Σ |∂ log p_t/∂W|·δW."""
    from rllib_grpo.rllib.learner.module import response_log_probs

    params = dict(model.named_parameters())
    worst = 0.0
    for row in range(len(batch["response_mask"])):
        one = {k: v[row:row + 1] for k, v in batch.items()}
        log_probs = response_log_probs(model, one, 1.0)["log_probs"][0]
        for t in range(int(one["response_mask"].sum())):
            grads = torch.autograd.grad(log_probs[t], [params[k] for k in rounding],
                                        retain_graph=True)
            moved = sum((g.abs() * rounding[k]).sum().item()
                        for g, k in zip(grads, rounding, strict=True))
            worst = max(worst, moved)
    return worst


def test_lora_checkpoint_exports_merged(lora_run, tmp_path):
    from rllib_grpo.cli.export_command import export_checkpoint
    from rllib_grpo.models import load_causal_lm, resolve_model

    batch, learner_lp = lora_run["batch"], lora_run["log_probs"]
    out = export_checkpoint(lora_run["checkpoint"], tmp_path / "merged")
    assert out.kind == "merged-lora"
    merged = _load(tmp_path / "merged")
    # Merged in float32, the export is the learner's policy with its adapted weights
    # rounded: compared in float64 (the exported float32 values, exactly) with the policy
    # (base + adapter, unmerged), the log-probs differ by what that rounding moves them
    # (to first order; its square is ~1e-15) plus the float32 log-softmax of both sides.
    policy = lora_run["policy64"]
    exported = _load(tmp_path / "merged", dtype=torch.float64)
    rounding = _merge_rounding(policy)
    policy_lp = _log_probs(policy, batch)
    scale = max(policy_lp.abs().max().item(), _logit_scale(exported, batch))
    bound = (_weight_rounding_bound(exported, batch, rounding)
             + float32_log_softmax_bound(scale, scale))
    assert (_log_probs(exported, batch) - policy_lp).abs().max().item() <= bound
    base = load_causal_lm(resolve_model("builtin:tiny"))
    assert (_log_probs(base, batch) - learner_lp).abs().max().item() > 1e-4  # the adapter counts
    export_checkpoint(lora_run["checkpoint"], tmp_path / "bf16", dtype="bfloat16")
    cast = merged.to(torch.bfloat16).state_dict()
    assert all(torch.equal(cast[k], v) for k, v in _load(tmp_path / "bf16").state_dict().items())


def test_lora_checkpoint_exports_a_peft_adapter(lora_run, tmp_path):
    from peft import AutoPeftModelForCausalLM

    from rllib_grpo.cli.export_command import export_checkpoint
    from rllib_grpo.models import resolve_model

    out = export_checkpoint(lora_run["checkpoint"], tmp_path / "adapter", lora_mode="adapter")
    assert out.kind == "lora-adapter"
    folder = tmp_path / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= {
        p.name for p in folder.iterdir()}
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(Path(resolve_model("builtin:tiny")))
    peft_lm = AutoPeftModelForCausalLM.from_pretrained(str(folder)).eval()  # base from the note
    diff = (_log_probs(peft_lm, lora_run["batch"]) - lora_run["log_probs"]).abs().max().item()
    assert diff <= 1e-6


def test_eval_scores_a_checkpoint_on_the_env_it_trained_on(lora_run, tmp_path):
    """No --env: the checkpoint's env, env_config and max_response_length; LoRA merged."""
    from rllib_grpo.cli.main import main

    out = tmp_path / "res.json"
    assert main(["eval", lora_run["checkpoint"], "--n", "2", "--num-prompts", "6",
                 "--sampler", "hf", "--out", str(out)], prog="rllib-grpo") == 0
    result = json.loads(out.read_text())
    assert result["env"] == "rllib_grpo/Arithmetic-v0"
    assert result["env_config"] == {"max_operand": 4}
    assert result["settings"]["max_response_length"] == 4 and result["num_prompts"] == 6
    assert "val-core/arithmetic/acc/mean@2" in result["metrics"]
    assert result["metrics"]["response_length/mean"] <= 4


# --------------------------------------------------------------------------- bad input, no Ray
def test_export_refuses_what_it_cannot_export(tmp_path, capsys):
    from rllib_grpo.cli.main import main
    from rllib_grpo.models import resolve_model
    from rllib_grpo.models.export import export_module_state

    def run(*argv: str) -> tuple[int, str]:
        code = main(["export", *argv], prog="rllib-grpo")
        return code, capsys.readouterr().err.strip()

    code, err = run(str(tmp_path / "nowhere"), str(tmp_path / "out"))
    assert code == 2 and err.endswith("no such checkpoint folder") and "\n" not in err
    code, err = run(resolve_model("builtin:tiny"), str(tmp_path / "out"))  # a model, not a ckpt
    assert code == 2 and "not a GRPO checkpoint" in err

    weights = _tiny_model_with_noise()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        export_module_state(weights, "builtin:tiny", tmp_path / "full")
    assert (tmp_path / "full" / "keep.txt").is_file()  # nothing touched
    with pytest.raises(ValueError, match="adapter-only export needs a LoRA"):
        export_module_state(weights, "builtin:tiny", tmp_path / "a", lora_mode="adapter")
    with pytest.raises(ValueError, match="do not fit"):
        export_module_state({**weights, "model.extra.weight": torch.zeros(2)}, "builtin:tiny",
                            tmp_path / "b")
    assert not (tmp_path / "b").exists()  # a failed export leaves no folder behind
    untied = {**weights, "lm_head.weight": weights["lm_head.weight"] + 1}
    with pytest.raises(ValueError, match="ties them"):
        export_module_state(untied, "builtin:tiny", tmp_path / "c")
    out = export_module_state(weights, "builtin:tiny", tmp_path / "full", overwrite=True)
    assert not (tmp_path / "full" / "keep.txt").exists() and out.kind == "full"
    loaded = _load(tmp_path / "full").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())


def test_a_bf16_learner_exports_bf16_and_upcasts_exactly(tmp_path):
    """``model_dtype="bfloat16"``: the folder keeps the learner's dtype unless told."""
    from rllib_grpo.models.export import export_module_state

    weights = {k: v.to(torch.bfloat16) for k, v in _tiny_model_with_noise().items()}
    assert export_module_state(weights, "builtin:tiny", tmp_path / "bf16").dtype == "bfloat16"
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    loaded = _load(tmp_path / "bf16").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in weights.items())
    export_module_state(weights, "builtin:tiny", tmp_path / "fp32", dtype="float32")
    upcast = _load(tmp_path / "fp32").state_dict()
    assert all(upcast[k].dtype == torch.float32 and torch.equal(upcast[k], v.float())
               for k, v in weights.items())


def test_a_tune_trial_folder_points_at_its_latest_checkpoint(tmp_path):
    from rllib_grpo.cli.checkpoint import CheckpointError, read_checkpoint

    for name in ("checkpoint_000000", "checkpoint_000001"):
        module = tmp_path.joinpath(name, "learner_group", "learner", "rl_module",
                                   "default_policy")
        module.mkdir(parents=True)
        (module / "module_state.pkl").write_bytes(b"")
        (module / "class_and_ctor_args.pkl").write_bytes(b"")
    with pytest.raises(CheckpointError, match="latest checkpoint is .*checkpoint_000001"):
        read_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="unreadable"):  # empty pickles
        read_checkpoint(tmp_path / "checkpoint_000001")


def _tiny_model_with_noise() -> dict[str, torch.Tensor]:
    from rllib_grpo.models import load_causal_lm, resolve_model

    model = load_causal_lm(resolve_model("builtin:tiny"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    return {k: v.clone() for k, v in model.state_dict().items()}
