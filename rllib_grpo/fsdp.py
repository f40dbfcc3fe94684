"""GRPO learners under Ray Train with FSDP2 (`torch.distributed.fsdp.fully_shard`).

With ``num_learners >= 2`` RLlib starts the learners as Ray Train workers in one
torch process group (gloo on CPU, NCCL on GPU).  Here:

* `FSDPGRPOLearner` shards each causal LM (every decoder layer, then the HF
  model as root; the frozen reference model the same way) inside `_make_module`,
  before the optimizers see the parameters, and skips RLlib's DDP wrapping.
  FSDP2 averages gradients over ranks and `agg_loss` multiplies by ``dp_size``
  (the world size) with globally all-reduced token/sequence counts, so one
  update equals the single-learner update.  Gradient clipping uses the global
  norm (the norm of DTensor gradients is all-reduced), and a non-finite norm
  skips the step on every rank together.
* The module's state is always the full HF state dict (`gather_full_state_dict`,
  collective), and the optimizer's state is saved in `torch.optim`'s usual
  index-keyed layout with full tensors, so checkpoints are RLlib's normal
  learner checkpoints: they restore into any number of learners, FSDP or not.
* `GRPOLearnerGroup` hands every learner whole prompt groups (each learner's
  k-th mini-batch is its share of the global k-th mini-batch) and runs state
  gathers and checkpoint saves on *all* learners: RLlib's own group asks learner
  0 alone, which would hang in the collective gather.
* `save_sharded_checkpoint` / `load_sharded_checkpoint` additionally write and
  read `torch.distributed.checkpoint` files (each learner its own shards, no
  gather), loadable into any number of learners.

LoRA runs keep DDP (`GRPOConfig.get_default_learner_class`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ray.rllib.core import COMPONENT_LEARNER, DEFAULT_MODULE_ID
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.torch_utils import convert_to_torch_tensor
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from rllib_grpo.learner import GRPOLearner, _all_reduce, _world

# Gather to rank 0, on the CPU: the other ranks get an empty dict (no copy of the model each).
FULL_TO_RANK0 = StateDictOptions(full_state_dict=True, cpu_offload=True)
# Every rank passes the full state and keeps its own shard of it.
FULL_ON_EVERY_RANK = StateDictOptions(full_state_dict=True, strict=True)


# --------------------------------------------------------------------------- sharding
DTYPES = {"model": None, "float32": torch.float32, "bfloat16": torch.bfloat16,
          "float16": torch.float16}


def _dtype(name: str | None) -> torch.dtype | None:
    """A dtype setting; ``model``/None keeps the parameters' own dtype."""
    if name is not None and name not in DTYPES:
        raise ValueError(f"FSDP dtype {name!r} is not one of {sorted(DTYPES)} (or 'auto').")
    return DTYPES.get(name)


def mixed_precision_policy(config: Any, device: torch.device) -> MixedPrecisionPolicy:
    """FSDP2 compute/reduce dtypes; ``auto`` is bf16 on GPUs and the model's dtype on CPU
    (so that CPU runs are exact)."""
    param = config.fsdp_param_dtype
    if param == "auto":
        param = "bfloat16" if device.type == "cuda" else None
    return MixedPrecisionPolicy(param_dtype=_dtype(param),
                                reduce_dtype=_dtype(config.fsdp_reduce_dtype))


def offload_policy(config: Any) -> OffloadPolicy:
    """Keep sharded parameters, gradients and optimizer states in host memory if asked."""
    if config.fsdp_cpu_offload:
        return CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    return OffloadPolicy()


def decoder_layers(lm: torch.nn.Module) -> list[torch.nn.Module]:
    """The transformer blocks of a HF causal LM, one FSDP unit each.

    HF names them in ``_no_split_modules``; else the longest ``ModuleList`` is taken.
    """
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if layers:
        return layers
    lists = [m for m in lm.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def shard_causal_lm(lm: torch.nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy,
                    offload: OffloadPolicy) -> None:
    """``fully_shard`` every decoder layer, then the HF model itself (the root).

    The root must be the HF model, not the RLModule: RLlib calls
    ``forward_train`` directly, which would bypass the root's forward hooks.
    """
    kwargs = {"mesh": mesh, "mp_policy": mp_policy, "offload_policy": offload}
    for layer in decoder_layers(lm):
        fully_shard(layer, **kwargs)
    fully_shard(lm, **kwargs)


def is_sharded(lm: torch.nn.Module) -> bool:
    return isinstance(lm, FSDPModule)


def _rank() -> int:
    return dist.get_rank() if _world() > 1 else 0


# --------------------------------------------------------------------------- state
def gather_full_state_dict(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full HF state dict of a sharded model on rank 0 (CPU); ``{}`` elsewhere. Collective."""
    return get_model_state_dict(lm, options=FULL_TO_RANK0)


def load_full_state_dict(lm: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load a full HF state dict (given on every rank) into a sharded model. Collective."""
    full = {k: torch.as_tensor(v) for k, v in state.items()}
    set_model_state_dict(lm, full, options=FULL_ON_EVERY_RANK)


def _param_fqns(module: torch.nn.Module, optim: torch.optim.Optimizer) -> list[str]:
    """Names of the optimizer's parameters in its own (index) order."""
    name_of = {id(p): name for name, p in module.named_parameters()}
    return [name_of[id(p)] for group in optim.param_groups for p in group["params"]]


def full_optimizer_state(module: torch.nn.Module, optim: torch.optim.Optimizer) -> dict:
    """``optim.state_dict()`` of the unsharded model (rank 0; ``{}`` elsewhere). Collective.

    Index-keyed like any torch optimizer, so a non-FSDP learner loads it as is.
    """
    if not optim.state:
        # DCP would "initialise" the state by taking a zero-lr step (Adam's step count 1).
        return optim.state_dict()
    by_name = get_optimizer_state_dict(module, optim, options=FULL_TO_RANK0)
    if not by_name:
        return {}
    order = [name for group in by_name["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    return {
        "state": {index[name]: value for name, value in by_name["state"].items()},
        "param_groups": [{**g, "params": [index[n] for n in g["params"]]}
                         for g in by_name["param_groups"]],
    }


def load_full_optimizer_state(module: torch.nn.Module, optim: torch.optim.Optimizer,
                              state: dict) -> None:
    """Load an index-keyed full optimizer state (on every rank) into sharded parameters."""
    if not state.get("state"):
        optim.load_state_dict(state)  # nothing to shard: hyper-parameters only
        return
    names = _param_fqns(module, optim)
    by_name = {
        "state": {names[int(i)]: convert_to_torch_tensor(s, device="cpu")
                  for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                         for g in state["param_groups"]],
    }
    set_optimizer_state_dict(module, optim, by_name, options=FULL_ON_EVERY_RANK)


# --------------------------------------------------------------------------- sharded checkpoints
def _dcp_state(learner: Any, with_empty_optimizers: bool) -> dict[str, Any]:
    """Each module's weights and each optimizer's state, sharded as they live."""
    state: dict[str, Any] = {}
    for module_id, rl_module in learner.module.items():
        state[f"{module_id}/model"] = get_model_state_dict(rl_module.unwrapped().lm)
    for name, optim in learner._named_optimizers.items():
        if optim.state or with_empty_optimizers:  # DCP would take a zero-lr step on empty ones
            module = learner.module[learner._optimizer_name_to_module[name]].unwrapped()
            state[f"{name}/optimizer"] = get_optimizer_state_dict(module, optim)
    return state


def _save_sharded(learner: Any, path: str) -> None:
    dcp.save(_dcp_state(learner, with_empty_optimizers=False), checkpoint_id=path)


def _load_sharded(learner: Any, path: str) -> None:
    saved = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
    state = _dcp_state(learner, with_empty_optimizers=True)
    state = {key: value for key, value in state.items()
             if any(k.startswith(key + ".") for k in saved)}
    dcp.load(state, checkpoint_id=path)  # in place, resharded to this learner's layout
    for module_id, rl_module in learner.module.items():
        set_model_state_dict(rl_module.unwrapped().lm, state[f"{module_id}/model"])
    for name, optim in learner._named_optimizers.items():
        if f"{name}/optimizer" in state:
            module = learner.module[learner._optimizer_name_to_module[name]].unwrapped()
            set_optimizer_state_dict(module, optim, state[f"{name}/optimizer"])


def save_sharded_checkpoint(learner_group: LearnerGroup, path: str) -> None:
    """Write model and optimizer state with `torch.distributed.checkpoint`: each learner
    writes its own shards (``path`` must be storage all learners see); nothing is gathered."""
    learner_group._get_results(learner_group.foreach_learner(lambda lr: _save_sharded(lr, path)))


def load_sharded_checkpoint(learner_group: LearnerGroup, path: str) -> None:
    """Load `save_sharded_checkpoint` files into any number of learners, FSDP or not
    (DCP reshards on load)."""
    learner_group._get_results(learner_group.foreach_learner(lambda lr: _load_sharded(lr, path)))


# --------------------------------------------------------------------------- learner
class FSDPGRPOLearner(GRPOLearner):
    """`GRPOLearner` whose causal LMs are sharded with FSDP2 across the learners."""

    @property
    def sharded(self) -> bool:
        return _world() > 1

    def _make_module(self):
        module = super()._make_module()  # already on self._device
        if self.sharded:
            self._shard(module)
        return module

    def _shard(self, module: Any) -> None:
        mesh = init_device_mesh(self._device.type, (_world(),))
        mp_policy = mixed_precision_policy(self.config, self._device)
        offload = offload_policy(self.config)
        for rl_module in module.values():
            for lm in (getattr(rl_module, "lm", None), getattr(rl_module, "ref_lm", None)):
                if lm is not None:
                    shard_causal_lm(lm, mesh, mp_policy, offload)

    def _make_modules_ddp_if_necessary(self) -> None:
        """FSDP2 already synchronises gradients: no DDP wrapper."""

    def _clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # DTensors: the global norm
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        # One verdict for all ranks: a step skipped on one rank only would split the shards.
        bad = torch.tensor(float(not torch.isfinite(norm).item()), device=self._device)
        bad = _all_reduce(bad, dist.ReduceOp.MAX)
        return math.nan if bad.item() else norm.item()

    def _get_optimizer_state(self) -> dict:
        if not self.sharded:
            return super()._get_optimizer_state()
        return {
            name: {"module_id": self._optimizer_name_to_module[name],
                   "state": full_optimizer_state(
                       self.module[self._optimizer_name_to_module[name]], optim)}
            for name, optim in self._named_optimizers.items()
        }

    def _set_optimizer_state(self, state: dict) -> None:
        if not self.sharded:
            return super()._set_optimizer_state(state)
        for name, entry in state.items():
            if name in self._named_optimizers:
                load_full_optimizer_state(self.module[entry["module_id"]],
                                          self._named_optimizers[name], entry["state"])


# --------------------------------------------------------------------------- learner group
def shard_rows(group_index: np.ndarray, num_shards: int, groups_per_minibatch: int,
               ) -> list[np.ndarray]:
    """Row indices for each learner: whole groups, mini-batch aligned.

    Each global mini-batch (``groups_per_minibatch`` consecutive groups) is cut
    into ``num_shards`` equal runs of groups, so learner r's k-th local
    mini-batch is exactly its share of the global k-th one.  When a mini-batch
    does not split into whole groups per learner, the whole step is split.
    """
    groups = list(dict.fromkeys(group_index.tolist()))  # in order of appearance
    block = groups_per_minibatch if groups_per_minibatch % num_shards == 0 else len(groups)
    if len(groups) % block or block % num_shards:
        raise ValueError(f"{len(groups)} groups do not split over {num_shards} learners in "
                         f"mini-batches of {groups_per_minibatch} groups.")
    per_shard = block // num_shards
    shards: list[list[int]] = [[] for _ in range(num_shards)]
    for start in range(0, len(groups), block):
        for r in range(num_shards):
            shards[r].extend(groups[start + r * per_shard: start + (r + 1) * per_shard])
    rows = [np.concatenate([np.flatnonzero(group_index == g) for g in s]) for s in shards]
    if len({len(r) for r in rows}) > 1:  # unequal shards would desynchronise collectives
        raise ValueError(f"Groups of unequal size: learners would get {[len(r) for r in rows]} "
                         "rows; every group must have group_size rows.")
    return rows


class GRPOLearnerGroup(LearnerGroup):
    """Learner group for >= 2 GRPO learners (FSDP2 or DDP): group-wise sharding, and
    state gathers / checkpoint saves that run on every learner."""

    def update(self, *, batch: MultiAgentBatch | None = None, **kwargs: Any) -> Any:
        if batch is not None and not self.is_local:
            return super().update(batches=self._shard_batch(batch), **kwargs)
        return super().update(batch=batch, **kwargs)

    def _shard_batch(self, batch: MultiAgentBatch) -> list[MultiAgentBatch]:
        columns = batch.policy_batches[DEFAULT_MODULE_ID]
        plan = self.config.batch_plan()
        rows_per_learner = shard_rows(np.asarray(columns["group_index"]), len(self),
                                      plan.prompts_per_minibatch)
        return [
            MultiAgentBatch({DEFAULT_MODULE_ID: SampleBatch(
                {k: np.asarray(v)[rows] for k, v in columns.items()})}, env_steps=len(rows))
            for rows in rows_per_learner
        ]

    def get_state(self, components=None, *, not_components=None, **kwargs: Any) -> dict:
        """Every learner takes part in the (collective) gather; rank 0's result is returned."""
        if self.is_local or not self._check_component(COMPONENT_LEARNER, components,
                                                      not_components):
            return super().get_state(components, not_components=not_components, **kwargs)
        comps = self._get_subcomponents(COMPONENT_LEARNER, components)
        not_comps = self._get_subcomponents(COMPONENT_LEARNER, not_components)
        results = self.foreach_learner(
            lambda learner: (_rank(),
                             learner.get_state(comps, not_components=not_comps, **kwargs)))
        by_rank = dict(self._get_results(results))
        return {COMPONENT_LEARNER: by_rank[0]}

    def save_to_path(self, path=None, *, state=None, filesystem=None, use_msgpack=False) -> str:
        """RLlib's layout; the state is gathered on all learners first (stock saving asks
        learner 0 alone, which would hang in the gather), then learner 0 writes it."""
        if state is None and not self.is_local:
            state = self.get_state()
        return super().save_to_path(path, state=state, filesystem=filesystem,
                                    use_msgpack=use_msgpack)
