"""Padding-free learner passes (`rllib_grpo.models.packing`) against the padded ones.

* Packed rows give the padded log-probs and entropies for llama and qwen2, with sdpa
  and eager attention, in both layouts (one row, or rows of the longest sequence), and
  the graph reaches the model even with no response token at all.
* One learner update on packed rows gives the padded update's gradients and weights
  for every loss aggregation, with fixed micro-batches and with a token budget.
* These equalities are checked on float64 models, to bounds derived from the dtypes and
  the values' scale (tests/conftest.py): in float32 the packed and padded updates'
  weights differed by up to 1.3e-6 depending on the CPU's kernels (Adam amplifies
  float32 noise on near-zero gradients).
* The token budget caps every micro-batch; the old-log-prob / reference passes and the
  update use the same micro-batches (with a token budget and two mini-batches they
  did not).
* The on-policy shortcut (old log-probs from the update's own forward) gives the same
  loss, gradients, weights and metrics as the separate pass, which it skips.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from tests.conftest import (
    GRAD_REL64,
    float32_sum_bound,
)
from tests.helpers import local_learner
from tests.helpers.learner_updates import fixed_batch
from tests.helpers.tiny_lms import log_probs_bound, padded_batch, tiny_lm

AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean",
             "seq-mean-token-sum-norm")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("varlen", [False, True], ids=["rows", "one-row"])
def test_packed_log_probs_equal_padded(arch, attn, varlen, monkeypatch):
    """On float64 models.  transformers' eager attention takes its softmax in float32
    (``softmax(..., dtype=torch.float32)``): a float32 step inside the float64 model, where
    the float64 mask's finfo.min becomes -inf and left-padded (fully masked) rows turn to
    NaN.  Here that softmax stays in float64 (only float64 inputs asking for float32)."""
    from rllib_grpo.models import packing
    from rllib_grpo.rllib.learner.module import response_log_probs

    softmax = torch.nn.functional.softmax

    def float64_softmax(input, dim=None, _stacklevel=3, dtype=None):
        return softmax(input, dim=dim, dtype=None if input.dtype == torch.float64 else dtype)

    monkeypatch.setattr(torch.nn.functional, "softmax", float64_softmax)
    monkeypatch.setattr(packing, "uses_varlen_attention", lambda lm: varlen)
    lm, batch = tiny_lm(arch, attn, torch.float64), padded_batch()
    padded = response_log_probs(lm, batch, 0.7, with_entropy=True)
    packed = response_log_probs(lm, batch, 0.7, with_entropy=True, packed=True)
    mask = batch["response_mask"].bool()
    bound = log_probs_bound(lm, batch, 0.7, padded)
    for key in ("log_probs", "entropy"):
        assert (packed[key] - padded[key])[mask].abs().max() <= bound
        assert (packed[key][~mask] == 0).all()
    layout = packing.pack_micro_batch(batch, varlen=varlen)
    lengths = (batch["prompt_mask"].sum(-1) + batch["response_mask"].sum(-1)).tolist()
    assert layout.num_real_tokens == sum(lengths)
    if varlen:
        assert layout.input_ids.shape == (1, sum(lengths))
    else:
        assert layout.input_ids.shape[1] == max(lengths)
        assert layout.input_ids.numel() < batch["prompt_ids"].numel() + batch["response_ids"].numel()


def test_positions_that_do_not_restart_change_the_log_probs():
    """The check above can fail: without restarting positions transformers sees one long
    sequence per row, and the log-probs move."""
    from rllib_grpo.models import packing

    lm, batch = tiny_lm("llama", "sdpa"), padded_batch()
    layout = packing.pack_micro_batch(batch, varlen=True)
    positions = torch.arange(layout.input_ids.shape[1])[None]
    with torch.no_grad():
        right = lm(input_ids=layout.input_ids, position_ids=layout.position_ids).logits
        wrong = lm(input_ids=layout.input_ids, position_ids=positions).logits
    assert (right - wrong).abs().max() > 1e-3  # > 100x the bound above (~1e-5)


def test_packed_forward_without_response_tokens_still_reaches_the_model():
    """A zero-weight micro-batch (an empty token-budget bin) must still run backward
    through the model: sharded learners reduce their gradients there together."""
    from rllib_grpo.rllib.learner.module import response_log_probs

    lm, batch = tiny_lm("llama", "sdpa"), padded_batch()
    batch["response_mask"].zero_()
    out = response_log_probs(lm, batch, 1.0, with_entropy=True, packed=True)
    assert (out["log_probs"] == 0).all() and out["log_probs"].requires_grad
    out["log_probs"].sum().backward()
    grads = [p.grad for p in lm.parameters()]
    assert all(g is not None for g in grads) and all((g == 0).all() for g in grads)


def test_pack_rows_fits_every_sequence_once_within_the_capacity():
    from rllib_grpo.models.packing import pack_rows

    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 30) for _ in range(rng.randint(1, 20))]
        capacity = rng.randint(max(lengths), 60)
        rows = pack_rows(lengths, capacity)
        assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
        assert all(sum(lengths[i] for i in row) <= capacity for row in rows)
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([5, 9], 8)


def test_token_budget_caps_every_micro_batch():
    from rllib_grpo.data.batching import num_micro_batches_for_budget, split_token_budget

    # ceil(18 / 9) = 2 micro-batches cannot hold three rows of 6 within 9 tokens each.
    assert num_micro_batches_for_budget([6, 6, 6], 9) == 3
    rng = random.Random(0)
    for _ in range(300):
        lengths = [rng.randint(0, 50) for _ in range(rng.randint(1, 40))]
        budget = rng.randint(max(max(lengths), 1), 200)
        fewest = num_micro_batches_for_budget(lengths, budget)
        for num in (fewest, fewest + rng.randint(1, 5)):  # more: another learner needs more
            bins = split_token_budget(lengths, num, budget)
            assert len(bins) == num
            assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
            assert max(sum(lengths[i] for i in b) for b in bins) <= budget
            assert num > len(lengths) or all(bins)


# ------------------------------------------------------------------ the learner


def _loss_abs_sum(logged: dict, agg_mode: str) -> float:
    """The aggregate of |per-token loss terms| of an update of the fixed batch, from its
    logged values: the policy term is -A·ratio with ratio 1 (the first step from the old
    log-probs' weights), the entropy and low_var_kl terms are >= 0 (their losses are their
    aggregates); the aggregation's token weights sum to ``agg_loss(mask, mask)``."""
    from rllib_grpo.algos import agg_loss

    config = local_learner.learner_config()
    mask = torch.as_tensor(fixed_batch(50, pad=0)["response_mask"])  # any vocabulary
    weights = agg_loss(mask, mask, agg_mode, global_num_tokens=mask.sum(),
                       global_num_seqs=len(mask), horizon=config.loss_horizon).item()
    adv = max(abs(logged["critic/advantages/max"]), abs(logged["critic/advantages/min"]))
    return (weights * adv + config.entropy_coeff * logged["actor/entropy_loss"]
            + config.kl_loss_coef * logged["actor/kl_loss"])


@pytest.mark.parametrize("budget", [None, 13], ids=["fixed", "token-budget"])
@pytest.mark.parametrize("agg_mode", AGG_MODES)
def test_packed_update_equals_padded_update(learner, agg_mode, budget):
    sizes = dict(use_dynamic_bsz=True, max_tokens_per_micro_batch=budget) if budget else {}
    padded = local_learner.update(learner, loss_agg_mode=agg_mode, use_remove_padding=False, **sizes)
    packed = local_learner.update(learner, loss_agg_mode=agg_mode, use_remove_padding=True, **sizes)
    assert local_learner.max_diff(padded["weights"], learner[1]) > 1e-5  # the update moved the weights
    local_learner.assert_same_update(learner, packed, padded)
    # The loss is a float32 sum (float32 log-probs) over the 8 x 4 response slots, the
    # micro-batches (<= 8) and its 3 terms.
    assert packed["logged"]["actor/loss"] == pytest.approx(
        padded["logged"]["actor/loss"],
        abs=float32_sum_bound(8 * 4 + 8 + 3, _loss_abs_sum(padded["logged"], agg_mode)))


def test_old_log_prob_reference_and_update_passes_share_micro_batches(learner, monkeypatch):
    """Token budget + two mini-batches: the passes before the update used to split the
    whole batch while the update split each mini-batch."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_grpo.rllib.learner import forward_passes as learner_module

    module = learner[0].module[DEFAULT_MODULE_ID]
    passes: dict[str, list[frozenset]] = {"old": [], "ref": [], "update": []}

    def rows_of(batch) -> frozenset:
        ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1)
        keep = batch["response_mask"].sum(-1) > 0  # an empty bin's stand-in row has none
        return frozenset(tuple(row.tolist()) for row in ids[keep])

    def spy(name, original):
        def wrapped(*args, **kwargs):
            batch = next(a for a in args if isinstance(a, dict))
            passes[name].append(rows_of(batch))
            return original(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(learner_module, "response_log_probs",
                        spy("old", learner_module.response_log_probs))
    monkeypatch.setattr(module, "reference_log_probs", spy("ref", module.reference_log_probs))
    monkeypatch.setattr(module, "forward_train", spy("update", module.forward_train))
    local_learner.update(learner, prompts_per_minibatch=1, use_dynamic_bsz=True,
            max_tokens_per_micro_batch=13)
    assert len(passes["update"]) >= 4  # 2 mini-batches x >= 2 micro-batches
    assert passes["old"] == passes["update"]
    assert passes["ref"] == passes["update"]


@pytest.mark.parametrize("budget", [None, 13], ids=["fixed", "token-budget"])
def test_on_policy_shortcut_gives_the_same_update_without_the_old_pass(learner, budget,
                                                                       monkeypatch):
    from rllib_grpo.rllib.learner import forward_passes as learner_module

    sizes = dict(use_dynamic_bsz=True, max_tokens_per_micro_batch=budget) if budget else {}
    separate = local_learner.update(learner, skip_old_log_prob_pass=False, **sizes)
    calls = []
    original = learner_module.response_log_probs
    monkeypatch.setattr(learner_module, "response_log_probs",
                        lambda *a, **k: calls.append(1) or original(*a, **k))
    shortcut = local_learner.update(learner, skip_old_log_prob_pass=True, **sizes)
    assert not calls  # no separate old-log-prob forward
    assert shortcut["logged"]["timing_s/old_log_prob"] == 0.0
    assert separate["logged"]["timing_s/old_log_prob"] > 0.0
    local_learner.assert_same_update(learner, shortcut, separate)
    # The same forward, with and without a graph: the same float32 log-probs, and the
    # metrics computed from them by the same code (measured: equal, bit for bit).
    for key in ("actor/loss", "actor/pg_loss", "actor/kl_loss", "actor/entropy",
                "actor/ppo_kl", "training/rollout_probs_diff_max"):
        assert shortcut["logged"][key] == pytest.approx(separate["logged"][key], abs=1e-7), key


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_shortcut_gives_the_same_rollout_is_weights_and_gap_metrics(learner, level, monkeypatch):
    """Stale samples (weights_version behind the learner) whose sampler log-probs differ
    from the learner's: the importance weights, some truncated, and the gap split by
    staleness are the same from the update's forward as from a separate pass."""
    rng = np.random.default_rng(1)
    columns = {"rollout_log_probs": rng.uniform(-3.6, -2.0, (8, 4)).astype(np.float32),
               "weights_version": np.array([0, 0, 0, 0, -1, -1, -1, -1], np.int64)}
    training = dict(rollout_is=level, rollout_is_threshold=2.0, max_staleness=1,
                    num_env_runners=1)
    separate = local_learner.update(learner, columns, skip_old_log_prob_pass=False, **training)
    shortcut = local_learner.update(learner, columns, skip_old_log_prob_pass=True, **training)
    assert shortcut["logged"]["timing_s/old_log_prob"] == 0.0
    assert 0.0 < separate["logged"]["rollout_corr/is_truncated_frac"] < 1.0
    assert local_learner.relative_diff(shortcut["grads"], separate["grads"]) <= GRAD_REL64
    for key in ("rollout_corr/is_weight_mean", "rollout_corr/is_truncated_frac",
                "training/rollout_log_probs_diff_max/staleness_1",
                "training/rollout_probs_diff_mean/staleness_0", "actor/pg_loss"):
        assert shortcut["logged"][key] == pytest.approx(separate["logged"][key], abs=1e-6), key
    without = local_learner.update(learner, columns, **{**training, "rollout_is": None})
    assert local_learner.relative_diff(without["grads"], separate["grads"]) > 1e-3  # the weights matter


def test_shortcut_only_when_each_sample_feeds_one_step_from_the_same_weights():
    from rllib_grpo.rllib.config.staleness import old_log_probs_from_update

    assert old_log_probs_from_update(local_learner.learner_config())
    for off in (dict(skip_old_log_prob_pass=False), dict(prompts_per_minibatch=1),
                dict(num_epochs=2), dict(use_kl_in_reward=True, use_kl_loss=False),
                dict(lora_rank=4, lora_dropout=0.1)):
        assert not old_log_probs_from_update(local_learner.learner_config(**off)), off


def test_every_update_logs_throughput(learner, monkeypatch):
    # A peak for the CPU (known GPUs only have one), so that perf/mfu/actor is logged.
    monkeypatch.setattr("rllib_grpo.rllib.learner.learner.peak_flops", lambda device: 1e12)
    logged = local_learner.update(learner)["logged"]
    assert logged["timing_s/update_policy"] > 0
    assert logged["perf/actor_tokens_per_s"] > 0
    params = sum(p.numel() for p in learner[0].module["default_policy"].lm.parameters())
    tokens = float(np.sum([5, 3, 5, 4, 2, 5, 3, 4]) + np.sum([4, 1, 3, 0, 4, 2, 4, 3]))
    expected = 6 * params * tokens / logged["timing_s/update_policy"] / 1e12
    assert logged["perf/mfu/actor"] == pytest.approx(expected, rel=1e-6)
    assert logged["perf/actor_tokens_per_s"] == pytest.approx(
        tokens / logged["timing_s/update_policy"], rel=1e-6)

    from rllib_grpo.rllib.learner.perf import PhaseTimes, peak_flops, step_metrics

    cpu = torch.device("cpu")
    assert peak_flops(cpu) is None
    times = PhaseTimes(cpu)
    with times.phase("update_policy", tokens=100.0):
        pass
    assert "perf/mfu/actor" not in step_metrics(times, 10, peak_flops(cpu))  # CPU: no MFU


@pytest.mark.parametrize("name, tflops", [
    ("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 80GB HBM3", 989.0), ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0), ("NVIDIA H200 NVL", 835.0), ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA H800 PCIe", 756.0), ("NVIDIA H800", 989.0), ("NVIDIA H20", 148.0),
    ("NVIDIA A100-PCIE-40GB", 312.0), ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA L40S", 362.0), ("NVIDIA L40", 181.0), ("NVIDIA L4", 121.0),
    ("NVIDIA A10", 125.0), ("NVIDIA GeForce RTX 4090", 165.0), ("Tesla T4", None)])
def test_mfu_peak_by_device_name(name, tflops, monkeypatch):
    """The MFU denominator is the board's own dense bf16 peak: an H100 PCIe (756) is not
    an H100 SXM (989, whose name is "H100 80GB HBM3"); unknown boards get no MFU."""
    from rllib_grpo.rllib.learner.perf import peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    peak = peak_flops(torch.device("cuda", 0))
    assert peak == (None if tflops is None else tflops * 1e12)


class _FakeLM(torch.nn.Module):
    """Just what `prefer_varlen_attention` touches of a transformers model."""

    def __init__(self) -> None:
        super().__init__()
        self.config = type("Config", (), {"_attn_implementation": "sdpa"})()

    def set_attn_implementation(self, name: str) -> None:
        self.config._attn_implementation = name


@pytest.fixture
def flash_probe():
    from rllib_grpo.models.packing import flash_attention_runs

    flash_attention_runs.cache_clear()
    yield flash_attention_runs
    flash_attention_runs.cache_clear()


def test_flash_attention_that_fails_to_import_is_not_used(tmp_path, monkeypatch, flash_probe):
    """An installed flash_attn built for another torch is found by ``find_spec`` but fails
    at import (undefined symbol): the model keeps sdpa instead of crashing at the first
    forward."""
    import importlib
    import importlib.util
    import sys

    package = tmp_path / "flash_attn"
    package.mkdir()
    (package / "__init__.py").write_text(
        "raise ImportError('flash_attn_2_cuda.so: undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "flash_attn", raising=False)
    importlib.invalidate_caches()
    assert importlib.util.find_spec("flash_attn") is not None  # what the old switch trusted

    from rllib_grpo.models.packing import attention_implementation, prefer_varlen_attention

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    lm = _FakeLM()
    assert not prefer_varlen_attention(lm, torch.device("cuda", 0), "bfloat16")
    assert attention_implementation(lm) == "sdpa"


def test_flash_attention_probe_runs_a_call_once(monkeypatch, flash_probe):
    """A flash_attn that imports but fails at its first kernel call is refused; one that
    runs is used; either verdict is probed once per device."""
    import sys
    import types

    calls = []

    def fake_module(works: bool) -> types.ModuleType:
        def flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, causal=False):
            calls.append((tuple(q.shape), cu_q.tolist(), max_q, causal))
            if not works:
                raise RuntimeError("CUDA error: no kernel image is available for execution")
            return q.clone()
        module = types.ModuleType("flash_attn")
        module.flash_attn_varlen_func = flash_attn_varlen_func  # type: ignore[attr-defined]
        return module

    cpu = torch.device("cpu")  # the probe's call is device-agnostic; cuda is checked before it
    monkeypatch.setitem(sys.modules, "flash_attn", fake_module(works=False))
    assert not flash_probe(cpu) and not flash_probe(cpu)
    assert len(calls) == 1 and calls[0][-1] is True

    flash_probe.cache_clear()
    monkeypatch.setitem(sys.modules, "flash_attn", fake_module(works=True))
    assert flash_probe(cpu) and flash_probe(cpu)
    assert len(calls) == 2

    from rllib_grpo.models.packing import attention_implementation, prefer_varlen_attention

    monkeypatch.setattr("rllib_grpo.models.packing.flash_attention_runs",
                        lambda device, module="flash_attn": module == "flash_attn")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    lm = _FakeLM()
    assert prefer_varlen_attention(lm, torch.device("cuda", 0), "bfloat16")
    assert attention_implementation(lm) == "flash_attention_2"
    assert not prefer_varlen_attention(_FakeLM(), torch.device("cuda", 0), "float32")


def _kernels(monkeypatch, capability: tuple[int, int], *, running: set[str],
             refused: set[str] = frozenset()) -> _FakeLM:
    """A CUDA device of ``capability`` on which the flash modules in ``running`` import and
    run their tiny call; a model whose transformers refuses the implementations in
    ``refused`` (its own availability check)."""
    import sys
    import types

    for module in ("flash_attn", "flash_attn_interface"):
        fake = types.ModuleType(module)

        def call(q, k, v, *args, _works=module in running, **kwargs):
            if not _works:
                raise RuntimeError("CUDA error: no kernel image is available for execution")
            return q.clone(), None  # FA3's (out, softmax_lse)
        fake.flash_attn_varlen_func = call  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, module, fake)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    lm = _FakeLM()
    real_set = lm.set_attn_implementation

    def set_attn_implementation(name: str) -> None:
        if name in refused:
            raise ImportError(f"{name} is not available")
        real_set(name)
    lm.set_attn_implementation = set_attn_implementation  # type: ignore[method-assign]
    return lm


# The probe's tiny call runs on the CPU tensors of a device named "cuda" only in name: the
# fakes never launch a kernel, so the CPU tensors the probe builds would fail on a real GPU.
FAKE_CUDA = torch.device("cpu")


@pytest.mark.parametrize("capability, running, refused, expected", [
    ((9, 0), {"flash_attn_interface", "flash_attn"}, set(), "flash_attention_3"),  # Hopper: FA3
    ((9, 0), {"flash_attn"}, set(), "flash_attention_2"),  # FA3 imports, its call fails
    ((9, 0), {"flash_attn_interface", "flash_attn"}, {"flash_attention_3"},
     "flash_attention_2"),  # transformers does not recognise the FA3 build
    ((8, 0), {"flash_attn_interface", "flash_attn"}, set(), "flash_attention_2"),  # Ampere
    ((9, 0), set(), set(), "sdpa"),  # neither runs
    ((8, 0), {"flash_attn_interface"}, set(), "sdpa"),  # FA3 only, not on Hopper
])
def test_fa3_on_hopper_else_fa2_else_sdpa(monkeypatch, flash_probe, capability, running,
                                          refused, expected):
    from rllib_grpo.models import packing

    lm = _kernels(monkeypatch, capability, running=running, refused=refused)
    real_runs = packing.flash_attention_runs
    probed: list[str] = []

    def runs_on_cpu_tensors(device, module="flash_attn"):
        probed.append(module)
        return real_runs(FAKE_CUDA, module)  # the real probe: import, tiny call, finite
    monkeypatch.setattr(packing, "flash_attention_runs", runs_on_cpu_tensors)
    assert packing.prefer_varlen_attention(lm, torch.device("cuda", 0), "bfloat16") == (
        expected != "sdpa")
    assert packing.attention_implementation(lm) == expected
    assert ("flash_attn_interface" in probed) == (capability[0] == 9)  # FA3 probed on sm90 only
