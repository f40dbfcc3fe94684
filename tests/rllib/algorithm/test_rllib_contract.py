"""The RLlib contract: every private RLlib name this package relies on, checked in one place.

A Ray upgrade that renames or re-signs one of them fails here, with the name and where the
package uses it, instead of deep inside a training run.  The second test makes sure every
RLlib hook the package overrides says so with ``@override``.
"""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from tests.conftest import REPO_ROOT

# (module, class or None for a module-level function, name, parameters or None for an
#  instance attribute, where the package uses it)
PRIVATE_RLLIB_NAMES = [
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_uncompiled_update",
     ["self", "batch", "kwargs"], "rllib/learner/learner.py: one mini-batch with micro-batches"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_make_module",
     ["self"], "rllib/learner/fsdp.py: shard before the optimizers exist"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner",
     "_make_modules_ddp_if_necessary", ["self"], "rllib/learner/fsdp.py: no DDP wrap under FSDP2"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_get_optimizer_state",
     ["self"], "rllib/learner/learner.py: dtype-keeping optimizer state; rllib/learner/fsdp.py: from shards"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_set_optimizer_state",
     ["self", "state"], "rllib/learner/fsdp.py: load a full optimizer state into shards"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward_train",
     ["self", "batch", "kwargs"], "rllib/learner/module.py: log-probs of the responses"),
    ("ray.rllib.core.rl_module.rl_module", "RLModule", "_forward",
     ["self", "batch", "kwargs"], "rllib/learner/module.py"),
    ("ray.rllib.core.learner.learner_group", "LearnerGroup", "_get_results",
     ["self", "results"], "rllib/learner/learner_group.py, rllib/learner/fsdp.py: gather on every learner; "
     "rllib/algorithm/sampling/strategy.py: the learners' policy version"),
    ("ray.rllib.utils.checkpoints", "Checkpointable", "_check_component",
     ["self", "name", "components", "not_components"], "rllib/learner/learner_group.py: get_state"),
    ("ray.rllib.utils.checkpoints", "Checkpointable", "_get_subcomponents",
     ["self", "name", "components"], "rllib/learner/learner_group.py: get_state"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig", "_value_error",
     ["self", "errmsg"], "rllib/config/grpo_config.py: validate"),
    ("ray.rllib.utils.framework", None, "get_device", ["config", "num_gpus_requested"],
     "rllib/learner/learner.py: the CPU where Ray's GPUs are fake (torch_learner.get_device)"),
    ("ray.rllib.core.learner.learner", "Learner", "_named_optimizers", None,
     "rllib/learner/learner.py, rllib/learner/fsdp.py: optimizers by name"),
    ("ray.rllib.core.learner.learner", "Learner", "_optimizer_name_to_module", None,
     "rllib/learner/fsdp.py: module of each optimizer"),
    ("ray.rllib.core.learner.torch.torch_learner", "TorchLearner", "_optimizer_parameters",
     None, "rllib/learner/learner.py: zero_grad / step / clip over every optimizer"),
    ("ray.rllib.core.learner.learner", "Learner", "_device", None,
     "rllib/learner/learner.py, rllib/learner/fsdp.py: the learner's device"),
    ("ray.rllib.core.learner.learner", "Learner", "_module", None,
     "rllib/learner/learner.py: trainable parameters"),
    ("ray.rllib.algorithms.algorithm_config", "AlgorithmConfig",
     "_dont_auto_sync_env_runner_states", None, "rllib/config/grpo_config.py: no connector-state sync"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_make_worker",
     ["self", "env_creator", "validate_env", "worker_index", "num_workers", "recreated_worker",
      "config", "spaces"], "rllib/algorithm/placement_group.py: each env runner in its seat"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_remote_args", None,
     "rllib/algorithm/placement_group.py: max_restarts of a placed env runner"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_policy_class", None,
     "rllib/algorithm/placement_group.py: an env runner's constructor arguments"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_logdir", None,
     "rllib/algorithm/placement_group.py: an env runner's constructor arguments"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_ds_shards", None,
     "rllib/algorithm/placement_group.py: an env runner's constructor arguments"),
    ("ray.rllib.env.env_runner_group", "EnvRunnerGroup", "_tune_trial_id", None,
     "rllib/algorithm/placement_group.py: an env runner's constructor arguments"),
    ("ray.train._internal.backend_executor", "BackendExecutor", "_placement_group", None,
     "rllib/learner/learner_group.py: the run's placement group outlives the learners"),
    ("ray.rllib.core.learner.learner", "Learner", "_weights_seq_no", None,
     "rllib/learner/weight_sender.py: the sequence number a weight sync carries; "
     "rllib/learner/learner.py, rllib/algorithm/sampling/strategy.py: the policy version (staleness)"),
]


@pytest.mark.parametrize("module,cls,name,params,where", PRIVATE_RLLIB_NAMES,
                         ids=[f"{c or m}.{n}" for m, c, n, _, _ in PRIVATE_RLLIB_NAMES])
def test_private_rllib_name_still_exists(module, cls, name, params, where):
    owner = importlib.import_module(module)
    if cls is not None:
        owner = getattr(owner, cls)
    label = f"{module}.{cls + '.' if cls else ''}{name} (used in {where})"
    if params is None:  # an instance attribute: assigned somewhere in the class's source
        sources = "".join(inspect.getsource(k) for k in owner.__mro__
                          if k.__module__.startswith("ray."))
        assert f"self.{name} =" in sources or f"self.{name}:" in sources, (
            f"Ray no longer sets {label}: adapt the package to its new name.")
        return
    assert hasattr(owner, name), f"Ray no longer has {label}: adapt the package."
    # Ray adds ``_ray_trace_ctx`` to methods of classes it has turned into actors.
    found = [p for p in inspect.signature(getattr(owner, name)).parameters
             if not p.startswith("_ray_")]
    assert found == params, f"{label} changed its parameters: {params} -> {found}"


GLUE = REPO_ROOT / "rllib_grpo" / "rllib"


def _overrides_without_decorator() -> tuple[list[str], set[str]]:
    """The RLlib hooks overridden without ``@override``, and the RLlib subclasses seen."""
    missing, subclasses = [], set()
    for path in sorted(GLUE.rglob("*.py")):  # every room: config/, learner/, algorithm/, ...
        name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        module = importlib.import_module(name.removesuffix(".__init__"))
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.ClassDef):
                continue
            cls = getattr(module, node.name)
            ray_bases = [b for b in cls.__mro__[1:] if b.__module__.startswith("ray.")]
            if ray_bases:
                subclasses.add(node.name)
            for item in node.body:
                if not isinstance(item, ast.FunctionDef) or item.name.startswith("__"):
                    continue
                if not any(item.name in vars(base) for base in ray_bases):
                    continue
                decorators = [ast.unparse(d) for d in item.decorator_list]
                if any(d.startswith("property") or d.endswith(".setter") for d in decorators):
                    continue  # a property of RLlib's, re-derived: override() takes functions only
                if not any(d.startswith("override(") for d in decorators):
                    missing.append(f"{path.relative_to(GLUE)}: {node.name}.{item.name}")
    return missing, subclasses


def test_every_overridden_rllib_hook_carries_override():
    missing, subclasses = _overrides_without_decorator()
    assert missing == []
    # The scan reaches the package's RLlib classes in their sub-packages (it once globbed
    # the top folder only and checked nothing).
    assert {"GRPO", "ResilientAlgorithm", "GRPOConfig", "GRPOLearner", "FSDPGRPOLearner",
            "GRPOLearnerGroup", "CausalLMRLModule", "TextEnvRunner"} <= subclasses, subclasses


def test_rllibs_loss_hook_is_required_but_unused():
    """RLlib declares ``compute_loss_for_module`` abstract; GRPOLearner's own
    ``_uncompiled_update`` computes the loss per micro-batch, so the hook refuses to run
    (a call would mean RLlib's one-forward-per-mini-batch path slipped back in)."""
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    from rllib_grpo.rllib.learner.learner import GRPOLearner

    assert "compute_loss_for_module" in TorchLearner.__abstractmethods__
    assert "_uncompiled_update" in vars(GRPOLearner)
    with pytest.raises(NotImplementedError, match="_uncompiled_update"):
        GRPOLearner.compute_loss_for_module(None, module_id="default_policy", config=None,
                                            batch={}, fwd_out={})


def test_rllib_builds_env_runner_groups_and_picks_learner_devices_by_module_name():
    """The names the package swaps while an algorithm sets up (`RunPlacement.env_runner_groups`)
    or a learner builds (`learner._cpu_where_gpus_are_fake`): a Ray that imported them
    differently would bypass the swap."""
    from ray.rllib.algorithms import algorithm
    from ray.rllib.core.learner.torch import torch_learner
    from ray.rllib.env.env_runner_group import EnvRunnerGroup
    from ray.rllib.utils.framework import get_device

    assert algorithm.EnvRunnerGroup is EnvRunnerGroup
    assert "EnvRunnerGroup(" in inspect.getsource(algorithm.Algorithm.setup)
    assert torch_learner.get_device is get_device
    assert "get_device(" in inspect.getsource(torch_learner.TorchLearner.build)
