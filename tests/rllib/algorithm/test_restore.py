"""Every restore path leaves the learners and every sampler (local and remote env runners)
on the restored weights, also in an algorithm that trained on (whose samplers hold newer
weights, of a newer version); `get_module` returns the policy with remote learners too."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import tiny_config

MODULE_STATE = "learner/rl_module/default_policy"


def _learner_weights(algo) -> tuple[dict[str, torch.Tensor], int]:
    """Learner rank 0's weights as the samplers get them (their dtype), and its version."""
    state = algo.learner_group.get_state(components=[MODULE_STATE, "learner/weights_seq_no"],
                                         inference_only=True)["learner"]
    weights = state["rl_module"]["default_policy"]
    return {k: torch.as_tensor(v).clone() for k, v in weights.items()}, state["weights_seq_no"]


def _sampler_weights(algo) -> list[tuple[dict[str, torch.Tensor], int]]:
    """Every training sampler's weights and weights version (local and remote runners)."""

    def weights(runner) -> tuple[dict[str, torch.Tensor], int]:
        return ({k: v.detach().cpu().clone()
                 for k, v in runner.sampler.model.state_dict().items()}, runner._weights_seq_no)

    return algo.env_runner_group.foreach_env_runner(weights)


def _mismatches(algo, weights: dict[str, torch.Tensor], version: int) -> list[str]:
    """Where the learner's or a sampler's weights or weights version differ from these."""
    learner = _learner_weights(algo)
    samplers = _sampler_weights(algo)
    assert len(samplers) == 1 + algo.env_runner_group.num_remote_env_runners()
    found = []
    for name, (tensors, seen_version) in [("learner", learner),
                                          *((f"sampler {i}", s) for i, s in enumerate(samplers))]:
        changed = [k for k in weights if not torch.equal(tensors[k], weights[k])]
        if seen_version != version or tensors.keys() != weights.keys() or changed:
            found.append(f"{name}: version {seen_version} (restored {version}), "
                         f"{len(changed)} of {len(weights)} tensors differ")
    return found


def test_every_restore_path_puts_the_restored_weights_in_every_sampler(ray_session, tmp_path):
    from ray import tune

    from rllib_grpo.rllib.algorithm import GRPO

    # A sampler in the driver and one in a remote env runner.
    algo = tiny_config(lr=1e-2).env_runners(
        num_env_runners=1, create_local_env_runner=True).build_algo()
    try:
        algo.train()
        algo.train()
        saved, version = _learner_weights(algo)
        path = algo.save_to_path(str(tmp_path / "iteration_2"))
        state = algo.get_state()
        restores = {
            "restore_from_path": lambda: algo.restore_from_path(path),
            "restore": lambda: algo.restore(path),
            "Tune's Trainable.restore": lambda: algo.restore(tune.Checkpoint(path)),
            "set_state": lambda: algo.set_state(state),
        }
        problems = {}
        for name, restore in restores.items():
            algo.train()  # the samplers get newer weights, of a newer version
            newer, _ = _learner_weights(algo)
            assert any(not torch.equal(newer[k], saved[k]) for k in saved), name
            restore()
            problems[name] = _mismatches(algo, saved, version)
    finally:
        algo.stop()
    restored = GRPO.from_checkpoint(path)
    try:
        problems["from_checkpoint"] = _mismatches(restored, saved, version)
    finally:
        restored.stop()
    failed = {name: found for name, found in problems.items() if found}
    assert not failed, "\n".join(f"{name}: {'; '.join(found)}" for name, found in failed.items())

@pytest.mark.parametrize("num_learners", [1, 2])  # 2: FSDP, sharded
def test_get_module_with_remote_learners_is_the_trained_policy(ray_session, num_learners):
    algo = tiny_config(lr=1e-2).learners(num_learners=num_learners).build_algo()
    try:
        algo.train()
        module = algo.get_module()
        # Independent of the learners: the driver's sampler got the trained weights by the
        # weight sync (float32 here, as the learners' weights).
        ((synced, _),) = _sampler_weights(algo)
        weights = module.lm.state_dict()
        assert weights.keys() == synced.keys()
        assert all(torch.equal(weights[k], synced[k]) for k in synced)
        assert algo.get_module("no_such_module") is None
    finally:
        algo.stop()
