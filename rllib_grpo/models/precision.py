"""Mixed precision as verl, TRL and OpenRLHF do it: fp32 master weights, bf16 compute.

* The trained parameters, their gradients and AdamW's states stay in the master dtype
  (``master_weights_dtype``, float32): an lr-1e-6 Adam step is ~1e-6 of a weight, far
  below bf16's spacing (2^-8 of it), so bf16 parameters would round most updates away.
* Forward and backward run in the compute dtype (``model_dtype``): under `compute_autocast`
  on one learner; FSDP2's ``MixedPrecisionPolicy`` casts the shards instead when sharded.
* The frozen reference and the samplers hold weights in the compute dtype; a weight sync
  casts the master weights on the learner (`cast_floating`), which also halves the bytes.
* Checkpoints keep torch tensors in their own dtype (`tensors_to_cpu` / `as_torch_tensors`):
  RLlib's numpy conversion has no bfloat16, and its way back turns every float into float32.

No Ray here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from rllib_grpo.models.loading import torch_dtype

LOW_PRECISION = (torch.bfloat16, torch.float16)


# CPU flags of native bf16 matmul instructions (x86: AVX512-BF16, AMX; Arm: BF16).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


def cpu_has_bf16_matmul(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU multiplies bf16 natively (a flag of `BF16_CPU_FLAGS` in
    ``cpuinfo``'s flags / Features lines; False where the file cannot be read).

    Only there does bf16 compute pay on CPU (a learner step takes less CPU time in bf16
    autocast than in fp32); without such instructions bf16 is emulated and slower.
    """
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("flags", "Features"))]
    except OSError:
        return False
    flags = {flag for line in lines for flag in line.split(":", 1)[-1].split()}
    return any(flag in flags for flag in BF16_CPU_FLAGS)


def trained_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """dtype of the parameters that train (the first one with ``requires_grad``)."""
    for param in model.parameters():
        if param.requires_grad:
            return param.dtype
    return None


def compute_autocast(params_dtype: torch.dtype | None, compute_dtype: str | torch.dtype,
                     device_type: str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``compute_dtype`` when the parameters are held in a wider dtype
    (fp32 master weights, bf16 compute); a no-op when they already are the compute dtype."""
    compute = torch_dtype(compute_dtype)
    if compute not in LOW_PRECISION or params_dtype in (None, compute):
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=compute)


def cast_floating(state: Mapping[str, torch.Tensor], dtype: str | torch.dtype
                  ) -> dict[str, torch.Tensor]:
    """Floating-point tensors of ``state`` cast to ``dtype`` (others as they are), on the
    tensors' own device: a weight sync casts before the copy to host, not after."""
    target = torch_dtype(dtype)
    if not isinstance(target, torch.dtype):
        raise ValueError(f"cast_floating needs a concrete dtype, got {dtype!r}")
    return {k: v.to(dtype=target) if v.is_floating_point() else v for k, v in state.items()}


def tensors_to_cpu(tree: Any) -> Any:
    """A copy of ``tree`` (dicts, lists, tuples) with every tensor detached, cloned to the
    CPU, dtype kept: a checkpointable optimizer state, bfloat16 included."""
    if torch.is_tensor(tree):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, Mapping):
        return {k: tensors_to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(tensors_to_cpu(v) for v in tree)
    return tree


def as_torch_tensors(tree: Any) -> Any:
    """``tree`` with numpy arrays turned into tensors of the same dtype (tensors kept as they
    are): loads states saved by `tensors_to_cpu` bit-exactly, and older numpy ones too."""
    if isinstance(tree, np.ndarray) and tree.dtype != object:
        return torch.from_numpy(np.array(tree))  # a writable copy
    if isinstance(tree, Mapping):
        return {k: as_torch_tensors(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return type(tree)(as_torch_tensors(v) for v in tree)
    return tree


def optimizer_state_for_load(state: Mapping[str, Any]) -> dict[str, Any]:
    """A saved ``optimizer.state_dict()`` ready for ``load_state_dict``: per-parameter
    buffers as tensors in their saved dtype (Adam casts them to its parameters' dtype),
    hyper-parameters (``param_groups``) untouched; a numeric ``step`` becomes a tensor."""
    per_param = {}
    for index, buffers in state.get("state", {}).items():
        buffers = as_torch_tensors(dict(buffers))
        if "step" in buffers and not torch.is_tensor(buffers["step"]):
            buffers["step"] = torch.tensor(float(buffers["step"]))
        per_param[index] = buffers
    return {**state, "state": per_param}
