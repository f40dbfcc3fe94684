"""GRPO learners under Ray Train with FSDP2 (`torch.distributed.fsdp.fully_shard`).

With ``num_learners >= 2`` RLlib starts the learners as Ray Train workers in one
torch process group (gloo on CPU, NCCL on GPU).  Here:

* `FSDPGRPOLearner` shards each causal LM (every decoder layer, then the HF
  model as root; the frozen reference model the same way, its shards in host memory
  with ``ref_param_offload``) inside `_make_module`, before the optimizers see the
  parameters, and skips RLlib's DDP wrapping.  Nothing is moved to the device whole:
  rank 0 loads the weights in host memory, the other ranks build on the meta device,
  and each rank's device receives its shards only (`rllib_grpo.rllib.choreography`).
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

import copy
import math
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.utils.annotations import override
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy
from torch.distributed.tensor import DTensor

from rllib_grpo.rllib.choreography import free_device_memory
from rllib_grpo.rllib.learner.distributed import (
    all_reduce,
    fill_shards_from_rank0,
    full_optimizer_state,
    load_full_optimizer_state,
    mixed_precision_policy,
    offload_policy,
    rank,
    shard_causal_lm,
    take_host_weights,
    world_size,
)
from rllib_grpo.rllib.learner.learner import GRPOLearner


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

    _module_spec: Any  # RLlib's `Learner` attribute, swapped while the module is built

    @property
    def sharded(self) -> bool:
        return world_size() > 1

    @override(GRPOLearner)
    def _make_module(self):
        """Shard before anything moves to the device (verl's ``fsdp2_load_full_state_dict``):
        rank 0 loads the weights in host memory, the other ranks build the models on the
        meta device (`CausalLMRLModule`'s ``on_meta``); every rank shards its models, and
        rank 0 sends each rank its shards (`fill_shards_from_rank0`).  The host holds one
        copy of the weights (rank 0's, until the shards are filled), each device its shards."""
        if not self.sharded:
            return super()._make_module()
        spec, self._module_spec = self._module_spec, self._sharded_build_spec()
        try:
            module = super()._make_module()  # nothing moves: `_map_module_to_device`
        finally:
            self._module_spec = spec
        self._shard(module)
        return module

    def _sharded_build_spec(self) -> Any:
        """The module spec this rank builds from: every model config marked ``sharded``,
        and ``on_meta`` except on rank 0."""
        spec = copy.deepcopy(self._module_spec or self.config.get_multi_rl_module_spec())
        specs = spec.rl_module_specs if isinstance(spec, MultiRLModuleSpec) else spec
        for one in specs.values() if isinstance(specs, dict) else [specs]:
            one.model_config = {**(one.model_config or {}), "sharded": True,
                                "on_meta": rank() != 0}
        return spec

    @override(GRPOLearner)
    def _map_module_to_device(self, module: Any) -> None:
        """Sharded: nothing moves whole; `_shard` puts each rank's shards on its device."""
        if not self.sharded:
            super()._map_module_to_device(module)

    def _shard(self, module: Any) -> None:
        mesh = init_device_mesh(self._device.type, (world_size(),))
        mp_policy = mixed_precision_policy(self.config, self._device)
        offload = offload_policy(self.config)
        # ref_param_offload: the reference's shards live in host memory, and each FSDP unit
        # visits the device for its forward (verl's ref param_offload under FSDP2).
        ref_offload = (CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
                       if self.config.ref_param_offload else offload)
        for rl_module in module.values():
            for lm, policy in ((getattr(rl_module, "lm", None), offload),
                               (getattr(rl_module, "ref_lm", None), ref_offload)):
                if lm is None:
                    continue
                weights = take_host_weights(lm) if rank() == 0 else None
                shard_causal_lm(lm, mesh, mp_policy, policy)
                on_host = isinstance(policy, CPUOffloadPolicy)
                fill_shards_from_rank0(lm, weights, torch.device("cpu") if on_host
                                       else self._device)
                del weights
        free_device_memory()  # the transfers' buffers, before the engines beside us need it

    @override(GRPOLearner)
    def _make_modules_ddp_if_necessary(self) -> None:
        """FSDP2 already synchronises gradients: no DDP wrapper."""

    def _clip_grad_norm(self, params: list[torch.Tensor], max_norm: float) -> float:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)  # DTensors: the global norm
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        # One verdict for all ranks: a step skipped on one rank only would split the shards.
        bad = torch.tensor(float(not torch.isfinite(norm).item()), device=self._device)
        bad = all_reduce(bad, dist.ReduceOp.MAX)
        return math.nan if bad.item() else norm.item()

    @override(GRPOLearner)
    def _get_optimizer_state(self) -> dict:
        if not self.sharded:
            return super()._get_optimizer_state()
        return {
            name: {"module_id": self._optimizer_name_to_module[name],
                   "state": full_optimizer_state(
                       self.module[self._optimizer_name_to_module[name]], optim)}
            for name, optim in self._named_optimizers.items()
        }

    @override(GRPOLearner)
    def _set_optimizer_state(self, state: dict) -> None:
        if not self.sharded:
            return super()._set_optimizer_state(state)
        for name, entry in state.items():
            if name in self._named_optimizers:
                load_full_optimizer_state(self.module[entry["module_id"]],
                                          self._named_optimizers[name], entry["state"])


