"""The learners' process group backend: what the config needs (no Ray cluster started)."""

from __future__ import annotations

from ray.rllib.core.learner import learner_group as rllib_learner_group

from rllib_grpo.rllib.learner.learner import GRPOLearner
from rllib_grpo.rllib.learner.learner_group import GRPOLearnerGroup
from rllib_grpo.rllib.placement import learners_backend
from tests.conftest import tiny_config


def _config(gpus: float, offload: bool):
    config = tiny_config(fsdp=True, fsdp_cpu_offload=offload)
    return config.learners(num_learners=2, num_gpus_per_learner=gpus)


def test_fsdp_cpu_offload_on_gpus_gets_gloo_for_its_cpu_tensors():
    """clip_grad_norm_ of CPU-offloaded DTensor gradients all-reduces on the CPU: an
    NCCL-only group has no backend for it (pytorch#148532; torchtune's fix)."""
    assert learners_backend(_config(1, offload=True)) == "cpu:gloo,cuda:nccl"
    assert learners_backend(_config(1, offload=False)) is None  # Ray Train's NCCL
    assert learners_backend(_config(0, offload=True)) is None  # Ray Train's gloo


def test_the_learner_group_creates_its_process_group_on_that_backend(monkeypatch):
    seen = []

    def rllib_init(self, *, config, module_spec=None, placement_group=None):
        seen.append(rllib_learner_group._get_backend_config(GRPOLearner).backend)
        self._is_shut_down = True  # what RLlib's __del__ reads

    monkeypatch.setattr(rllib_learner_group.LearnerGroup, "__init__", rllib_init)
    GRPOLearnerGroup(config=_config(1, offload=True))
    GRPOLearnerGroup(config=_config(1, offload=False))
    assert seen == ["cpu:gloo,cuda:nccl", None]
    assert rllib_learner_group._get_backend_config(GRPOLearner).backend is None  # restored
