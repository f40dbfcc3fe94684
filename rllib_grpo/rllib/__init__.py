"""Layer 4, RLlib glue, one folder per process a line runs in:

* `config` (wherever a config is built: the user's process, the driver): the settings table,
  `GRPOConfig`, its checks, `explain` and the memory plan;
* `learner` (each learner actor, a Ray Train worker): `GRPOLearner` and its FSDP2 variant, the
  learner group, the causal-LM RLModule, micro-batches, the sender side of a weight sync;
* `env_runner` (each env-runner actor): `TextEnvRunner`, multi-turn sampling, the receiving
  side of a weight sync;
* `algorithm` (the driver): `GRPO`, its sampling strategies, resilience, checkpoints and the
  driver's side of a weight sync;
* `placement` (any process): where this process lives (Ray node, visible GPUs), which both
  sides of a weight sync report.

Lower rooms never import higher ones: config < learner, env_runner < algorithm (the config
names the learner and env-runner classes by their import paths, as RLlib's own configs
may).  Imports Ray; imported lazily by ``rllib_grpo``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import ModuleType

# Checkpoints written before the folders by process pickled classes under these module
# names (the other old names, ``rllib.config``, ``rllib.learner``, ``rllib.env_runner`` and
# ``rllib.algorithm``, are the packages now, which export the same classes).
MOVED_MODULES = {
    "rllib_grpo.rllib.module": "rllib_grpo.rllib.learner.module",
    "rllib_grpo.rllib.fsdp": "rllib_grpo.rllib.learner.fsdp",
    "rllib_grpo.rllib.learner_group": "rllib_grpo.rllib.learner.learner_group",
}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that now holds its classes."""

    def find_spec(self, fullname: str, path: object = None, target: object = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED_MODULES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
