"""Two FSDP learners (`FSDPGRPOLearner`, gloo on CPU) built in processes of their own, each
recording every tensor its build creates: ``python tests/helpers/fsdp_build_check.py
SPEC_JSON`` prints one line ``RESULT <json>`` (no Ray: the two processes form the
`torch.distributed` group Ray Train would).

SPEC: ``{"training": {...}}``, `tiny_config` settings (a KL term makes a reference model).

RESULT, per rank: ``full_tensors``: the tensors of a full parameter's shape (sharded ones:
where the shard is smaller) that the build allocated on a real device, as ``[phase, op,
shape]`` with phase ``build`` (the models made) or ``shard`` (sharded and filled);
``built_on``: the devices of the models' parameters when the sharding starts; per model
(``policy``, ``reference``) ``local_numel`` / ``total_numel``, ``shapes`` and ``devices``
of its parameters and its FSDP ``offload`` policy; ``host_ref``: whether a `HostOffloaded`
reference is there; ``reference_resharded``: after a reference pass every parameter of the
reference is a shard again; and on rank 0 ``weights_match``: the gathered full weights of
each model equal the model folder's, ``reference_diff``: the largest difference of that
pass's log-probs from the folder's model's (``reference_scale``: their largest magnitude).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WORLD = 2


class _FullSizeRecorder:
    """A `TorchDispatchMode` (made in the child, where torch is imported) that records
    every op output that allocates a full parameter's shape on a real device: a new
    storage (views share their input's) of a plain tensor, or of a DTensor's local shard."""

    def __init__(self, shapes: set[tuple[int, ...]]) -> None:
        from torch.utils._python_dispatch import TorchDispatchMode

        recorder = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                recorder.see(func, (args, kwargs), out)
                return out

        self.shapes, self.phase, self.seen = shapes, "build", []
        self.mode = Mode()

    def see(self, func: Any, inputs: Any, out: Any) -> None:
        import torch
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_leaves

        def plain(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        def storage(t: torch.Tensor) -> int:
            return plain(t).untyped_storage().data_ptr()

        given = {storage(t) for t in tree_leaves(inputs)
                 if isinstance(t, torch.Tensor) and not t.is_meta}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and not t.is_meta and storage(t) not in given \
                    and tuple(plain(t).shape) in self.shapes:
                self.seen.append([self.phase, str(func), list(plain(t).shape)])


def _shardable_shapes(model_path: str) -> set[tuple[int, ...]]:
    """Full shapes of the parameters whose shard is smaller than the whole (dim 0 >= 2)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_path))
    return {tuple(p.shape) for p in lm.parameters() if p.shape[0] >= WORLD}


def _model_report(lm: Any) -> dict[str, Any]:
    from torch.distributed.tensor import DTensor

    params = list(lm.parameters())
    return {"local_numel": sum((p.to_local() if isinstance(p, DTensor) else p).numel()
                               for p in params),
            "total_numel": sum(p.numel() for p in params),
            "shapes": [list(p.shape) for p in params],
            "devices": sorted({str((p.to_local() if isinstance(p, DTensor) else p).device)
                               for p in params}),
            "sharded": all(isinstance(p, DTensor) for p in params)}


def _rank(rank: int, init_file: str, spec: dict[str, Any], out: str) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    from rllib_grpo.models.loading import load_causal_lm
    from rllib_grpo.models.model_registry import resolve_model
    from rllib_grpo.rllib.config.grpo_config import TEXT_SPACE
    from rllib_grpo.rllib.learner.distributed import FULL_TO_RANK0
    from rllib_grpo.rllib.learner.fsdp import FSDPGRPOLearner
    from tests.conftest import tiny_config

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=WORLD)
    config = tiny_config(**spec["training"])
    path = resolve_model(config.model_path)
    recorder = _FullSizeRecorder(_shardable_shapes(path))

    built_on: list[str] = []

    class Recording(FSDPGRPOLearner):
        def _shard(self, module: Any) -> None:
            rl_module = module["default_policy"]
            built_on.extend(sorted({str(p.device) for lm in (rl_module.lm, rl_module.ref_lm)
                                    if lm is not None for p in lm.parameters()}))
            recorder.phase = "shard"
            super()._shard(module)
            recorder.phase = "after"

    config.learners(num_learners=WORLD, learner_class=Recording)
    with recorder.mode:
        learner = config.build_learner(spaces={"default_policy": (TEXT_SPACE, TEXT_SPACE)})
    module = learner.module["default_policy"].unwrapped()
    report: dict[str, Any] = {
        "full_tensors": [s for s in recorder.seen if s[0] != "after"],
        "policy": _model_report(module.lm),
        "reference": None if module.ref_lm is None else _model_report(module.ref_lm),
        "host_ref": module._host_ref is not None, "built_on": built_on,
        "offload": {name: type(lm._get_fsdp_state()._fsdp_param_group.offload_policy).__name__
                    for name, lm in (("policy", module.lm), ("reference", module.ref_lm))
                    if lm is not None}}
    # One reference pass as the learner runs it (the sharded, offloaded reference visits the
    # device unit by unit, and is resharded after), against the folder's model on rank 0.
    from torch.distributed.tensor import DTensor

    from rllib_grpo.rllib.learner.module import response_log_probs
    from tests.helpers.learner_updates import fixed_batch

    vocab = module.lm.config.vocab_size
    batch = {k: torch.as_tensor(v) for k, v in fixed_batch(vocab, pad=0).items()}
    with module.reference_on(learner._device):
        ref_log_probs = module.reference_log_probs(batch)
    if module.ref_lm is not None:
        report["reference_resharded"] = all(isinstance(p, DTensor)
                                            for p in module.ref_lm.parameters())
    if rank == 0:
        plain = response_log_probs(load_causal_lm(path), batch, module.temperature,
                                   packed=module.packed)["log_probs"]
        mask = batch["response_mask"].bool()
        report["reference_diff"] = (ref_log_probs - plain)[mask].abs().max().item()
        report["reference_scale"] = plain[mask].abs().max().item()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    gathered = {name: get_model_state_dict(lm, options=FULL_TO_RANK0)
                for name, lm in (("policy", module.lm), ("reference", module.ref_lm))
                if lm is not None}
    if rank == 0:
        match = {}
        for name, state in gathered.items():
            dtype = next(iter(state.values())).dtype
            folder = load_causal_lm(path, dtype=dtype).state_dict()
            match[name] = state.keys() == folder.keys() and all(
                torch.equal(state[k], folder[k]) for k in folder)
        report["weights_match"] = match
    with open(out, "w") as file:
        json.dump(report, file)
    dist.destroy_process_group()


def _distinct_shapes_model(folder: str) -> str:
    """A tiny causal LM whose shards' shapes are no parameter's full shape (hidden 48, 2
    heads of 24 with 2 KV heads, MLP 80): a full-shaped tensor is a full parameter."""
    from rllib_grpo.models.loading import build_tiny_causal_lm, save_model_dir
    from rllib_grpo.models.tokenizers import DEFAULT_ALPHABET, build_char_tokenizer

    tokenizer = build_char_tokenizer(DEFAULT_ALPHABET)
    model = build_tiny_causal_lm(tokenizer, hidden_size=48, num_heads=2, num_kv_heads=2,
                                 intermediate_size=80)
    return save_model_dir(model, tokenizer, os.path.join(folder, "model"))


def main() -> None:
    import torch.multiprocessing as mp

    spec = json.loads(sys.argv[1])
    with tempfile.TemporaryDirectory() as folder:
        spec["training"] = {"model_path": _distinct_shapes_model(folder), **spec["training"]}
        init_file = os.path.join(folder, "init")
        outs = [os.path.join(folder, f"rank{r}.json") for r in range(WORLD)]
        mp.spawn(_spawned, args=(init_file, spec, outs), nprocs=WORLD, join=True)
        reports = []
        for out in outs:
            with open(out) as file:
                reports.append(json.load(file))
    print("RESULT " + json.dumps(reports), flush=True)


def _spawned(rank: int, init_file: str, spec: dict[str, Any], outs: list[str]) -> None:
    _rank(rank, init_file, spec, outs[rank])


if __name__ == "__main__":
    main()
