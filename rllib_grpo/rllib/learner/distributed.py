"""torch.distributed helpers for the learners: world size and all-reduce, FSDP2 sharding of
a causal LM, and full (unsharded) model/optimizer state dicts gathered from or loaded into
shards.  Every function works with one process (no group) as with many."""


from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor

from rllib_grpo.models.precision import as_torch_tensors, optimizer_state_for_load, tensors_to_cpu


def world_size() -> int:
    """Processes in the default group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_reduce(t: torch.Tensor, op: Any = None) -> torch.Tensor:
    """In-place all-reduce (sum by default) over the learners; the identity for one."""
    if world_size() > 1:
        dist.all_reduce(t, op=op or dist.ReduceOp.SUM)
    return t


def gradient_sync(module: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """The context of one micro-batch's forward and backward: with DDP (RLlib's wrapper,
    ``fsdp=False`` or LoRA) ``sync=False`` accumulates the gradients locally (``no_sync``),
    so a mini-batch all-reduces once, on its last micro-batch (DDP would all-reduce every
    backward).  Every learner runs the same number of micro-batches, so the last is the
    same on all.  Nothing to do for one learner or FSDP2 (which reduce-scatters per
    backward: skipping it would keep unsharded gradients)."""
    if sync or not isinstance(module, torch.nn.parallel.DistributedDataParallel):
        return contextlib.nullcontext()
    return module.no_sync()


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
    return DTYPES.get(name) if name is not None else None


def mixed_precision_policy(config: Any, device: torch.device) -> MixedPrecisionPolicy:
    """FSDP2 compute/reduce dtypes, verl's ``MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32)`` for ``model_dtype="bfloat16"``: the shards (master weights) and
    AdamW states stay in ``master_weights_dtype``, each unit is all-gathered and computed in
    the compute dtype, and gradients are reduce-scattered in fp32.  ``fsdp_param_dtype``
    ``auto`` is the compute dtype (``model_dtype`` resolved) on every device."""
    param = config.fsdp_param_dtype
    if param == "auto":
        param = config.compute_dtype
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
    return list(max(lists, key=lambda modules: len(list(modules)))) if lists else []


def shard_causal_lm(lm: torch.nn.Module, mesh: DeviceMesh, mp_policy: MixedPrecisionPolicy,
                    offload: OffloadPolicy) -> None:
    """``fully_shard`` every decoder layer, then the HF model itself (the root).

    The root must be the HF model, not the RLModule: RLlib calls
    ``forward_train`` directly, which would bypass the root's forward hooks.
    """
    kwargs: dict[str, Any] = {"mesh": mesh, "mp_policy": mp_policy, "offload_policy": offload}
    for layer in decoder_layers(lm):
        fully_shard(layer, **kwargs)
    fully_shard(lm, **kwargs)


def take_host_weights(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0's loaded weights, before sharding: every parameter and buffer of ``lm`` by
    name (the host copy the shards are filled from, `fill_shards_from_rank0`), and ``lm``
    left on the meta device like the other ranks' (its tensors now only in the result)."""
    weights = {name: t.detach() for name, t in
               (*lm.named_parameters(remove_duplicate=False),
                *lm.named_buffers(remove_duplicate=False))}
    # Tensor by tensor, one meta tensor per host one: tied parameters stay tied
    # (``lm.to("meta")`` would give each module a parameter of its own).
    params: dict[int, torch.nn.Parameter] = {}
    buffers: dict[int, torch.Tensor] = {}
    for module in lm.modules():
        for key, param in module._parameters.items():
            if param is not None:
                module._parameters[key] = params.setdefault(id(param), torch.nn.Parameter(
                    torch.empty_like(param, device="meta"), requires_grad=param.requires_grad))
        for key, buffer in module._buffers.items():
            if buffer is not None:
                module._buffers[key] = buffers.setdefault(
                    id(buffer), torch.empty_like(buffer, device="meta"))
    return weights


def shard_rows(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """``(first row, row count)`` of each rank's shard of a tensor of ``num_rows`` rows:
    FSDP2's ``Shard(0)`` layout (``torch.chunk``'s chunks, trailing ranks empty)."""
    chunk = -(-num_rows // num_shards)
    return [(min(r * chunk, num_rows), max(0, min(chunk, num_rows - r * chunk)))
            for r in range(num_shards)]


@torch.no_grad()
def fill_shards_from_rank0(lm: torch.nn.Module, weights: dict[str, torch.Tensor] | None,
                           device: torch.device) -> None:
    """Materialise ``lm`` (`shard_causal_lm` on the meta device) on this rank: its shards
    allocated on ``device`` (the host where the shards are offloaded), then filled with rank
    0's ``weights`` (`take_host_weights`; None on the other ranks).  Rank 0 sends each rank
    only its rows of each parameter, one shard at a time, so no rank but 0 ever holds a
    full tensor and no device a full parameter (torch's ``broadcast_from_rank0`` would put
    each full tensor on every rank's device).  Buffers are not sharded: rank 0 broadcasts
    them whole (rotary tables, not in the state dict).  Collective."""
    lm.to_empty(device=device)  # FSDP2 re-registers (and pins, if asked) each local shard
    me, ranks = rank(), world_size()
    whole: list[tuple[str, torch.Tensor]] = list(lm.named_buffers())
    for name, param in lm.named_parameters():
        if not isinstance(param, DTensor):  # not sharded: sent whole, as the buffers
            whole.append((name, param))
            continue
        local, rows = param.to_local(), shard_rows(param.shape[0], ranks)
        if tuple(local.shape) != (rows[me][1], *param.shape[1:]):
            raise RuntimeError(f"FSDP's shard of {name} on rank {me} has shape "
                               f"{tuple(local.shape)}, not the rows {rows[me]} expected")
        if me == 0:
            assert weights is not None
            for dst, (first, count) in enumerate(rows):
                part = weights[name].narrow(0, first, count)
                if dst == 0:
                    local.copy_(part)
                elif count:
                    dist.send(part.to(local.device, local.dtype).contiguous(), dst=dst)
        elif rows[me][1]:
            dist.recv(local, src=0)
    for name, tensor in whole:
        if me == 0:
            assert weights is not None
            tensor.copy_(weights[name])
        dist.broadcast(tensor, src=0)


def rank() -> int:
    return dist.get_rank() if world_size() > 1 else 0


# --------------------------------------------------------------------------- state
def gather_full_state_dict(lm: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Full HF state dict of a sharded model on rank 0 (CPU); ``{}`` elsewhere. Collective."""
    return get_model_state_dict(lm, options=FULL_TO_RANK0)  # type: ignore[return-value]


def load_full_state_dict(lm: torch.nn.Module, state: dict[str, Any]) -> None:
    """Load a full HF state dict (given on every rank) into a sharded model. Collective."""
    full: dict[str, Any] = {k: torch.as_tensor(v) for k, v in state.items()}
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
    by_name: Any = get_optimizer_state_dict(module, optim, options=FULL_TO_RANK0)
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
    by_name: Any = {
        "state": {names[int(i)]: as_torch_tensors(s)
                  for i, s in state["state"].items()},
        "param_groups": [{**g, "params": [names[int(i)] for i in g["params"]]}
                         for g in state["param_groups"]],
    }
    set_optimizer_state_dict(module, optim, by_name, options=FULL_ON_EVERY_RANK)




# --------------------------------------------------------------------------- one learner's optimizers
def optimizer_states(learner: Any) -> dict:
    """Every optimizer's ``state_dict()`` as CPU torch tensors in their own dtype (RLlib's
    layout: ``{name: {"module_id", "state"}}``).  RLlib's default converts to numpy, which
    has no bfloat16, and reads every float back as float32."""
    return {name: {"module_id": learner._optimizer_name_to_module[name],
                   "state": tensors_to_cpu(optim.state_dict())}
            for name, optim in learner._named_optimizers.items()}


def load_optimizer_states(learner: Any, state: dict) -> None:
    """Load `optimizer_states` (or RLlib's numpy ones) bit-exactly, building an optimizer
    for a module that has none yet, as RLlib does."""
    for name, entry in state.items():
        module_id = entry["module_id"]
        if name not in learner._named_optimizers and module_id in learner.module:
            learner.configure_optimizers_for_module(
                module_id=module_id, config=learner.config.get_config_for_module(module_id))
        if name in learner._named_optimizers:
            learner._named_optimizers[name].load_state_dict(
                optimizer_state_for_load(entry["state"]))
