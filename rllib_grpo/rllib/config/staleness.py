"""The checks and the explanation of ``max_staleness`` (asynchronous rollouts) and of when
the update's own forward gives the old log-probs; the driver's pipeline
(`rllib_grpo.rllib.algorithm.sampling.one_step_off`) and the learner read these decisions."""

from __future__ import annotations

from rllib_grpo.rllib.config.settings import GRPOSettings, choice_error


def async_errors(c: GRPOSettings) -> list[str]:
    """``max_staleness`` settings that cannot run, each naming the field and the fix."""
    k = getattr(c, "max_staleness", 0)
    if isinstance(k, bool) or not isinstance(k, int) or k < 0:
        return [f"max_staleness={k!r} must be an integer >= 0 (0 = synchronous GRPO, 1 = "
                "one step off policy)."]
    mode = getattr(c, "rollout_mode", "auto")
    if error := choice_error("rollout_mode", mode, ROLLOUT_MODES):
        return [error]
    if mode == "sync" and k:
        return [f"rollout_mode='sync' trains on fresh samples only, but max_staleness={k}: "
                "set max_staleness=0, or rollout_mode='one_step_off' / 'continuous'."]
    if mode in ("one_step_off", "continuous") and not k:
        return [f"rollout_mode={mode!r} needs max_staleness >= 1 (the bound on how many "
                "updates old a trained token may be): set max_staleness=1 (or more)."]
    # (RLlib validates an evaluation copy too, with its own runner count: not GRPO's.)
    if k >= 1 and c.num_env_runners < 1 and not getattr(c, "in_evaluation", False):
        return [f"max_staleness={k} overlaps generation and training, which needs the "
                "sampler in its own process: set num_env_runners >= 1 (e.g. "
                ".env_runners(num_env_runners=1)), or "
                "max_staleness=0."]
    if mode == "continuous":
        return _continuous_errors(c)
    return []


def _continuous_errors(c: GRPOSettings) -> list[str]:
    """What ``rollout_mode='continuous'`` does not run, each with its fix."""
    if c.sampler == "hf":
        return ["rollout_mode='continuous' loads weights between two decode steps of a vLLM "
                "engine; the transformers sampler generates a batch in one call: set "
                "sampler='vllm' (or 'auto' with vLLM installed), or rollout_mode='one_step_off'."]
    if c.adv_estimator == "remax":
        return ["rollout_mode='continuous' does not sample ReMax's greedy baselines: use "
                "another estimator, or rollout_mode='one_step_off'."]
    if not isinstance(c.partial_rollout, bool):
        return [f"partial_rollout={c.partial_rollout!r} must be True or False."]
    return []


ROLLOUT_MODES = ("auto", "sync", "one_step_off", "continuous")


def async_pitfalls(c: GRPOSettings) -> list[str]:
    """Settings that run with ``max_staleness`` >= 1 but probably not as meant."""
    if not getattr(c, "max_staleness", 0):
        return []
    if not c.rollout_is:
        return [f"max_staleness={c.max_staleness} trains on samples one policy update old "
                "without a correction of the sampler/learner gap: consider rollout_is='token' or "
                "'sequence' (truncated importance weights pi_old / pi_rollout)."]
    return []


def async_line(c: GRPOSettings) -> str:
    """`explain`'s line on the rollout pipeline and the staleness bound."""
    k = getattr(c, "max_staleness", 0)
    if not k:
        return ("rollouts:                      synchronous (sample -> update -> sync weights; "
                "max_staleness=0)")
    if getattr(c, "rollout_mode", "auto") == "continuous":
        return (f"rollouts:                      continuous: env runners never stop, up to {k} "
                f"step(s) of groups in flight ({k * c.prompts_per_step} groups), finished groups "
                "stream to the learner; weights loaded between two decode steps, unfinished "
                "responses " + ("continue under the new weights (partial_rollout)"
                                if c.partial_rollout else "sampled again (partial_rollout=False)")
                + f"; tokens more than {k} update(s) old are never trained (their groups are "
                "dropped and sampled again); in-flight samples are not checkpointed")
    return (f"rollouts:                      one step off policy: env runners generate step "
            f"k+1 while the learner trains on step k, weights synced between generations; "
            f"trained groups are 1 update old, never more than max_staleness={k} (older "
            "ones dropped and sampled again); in-flight samples are not checkpointed")


def old_log_probs_from_update(config: GRPOSettings) -> bool:
    """Whether the update's own forward gives the old log-probs (``skip_old_log_prob_pass``).

    Only when each sample feeds exactly one optimizer step, from the weights a separate
    pass would use (one epoch, one mini-batch per step), no advantage reads the old
    log-probs (the in-reward KL does), and the training forward is deterministic (LoRA
    dropout would make it differ from an eval pass).  The rollout importance weights
    (``rollout_is``) and the rollout/trainer gap metrics are per row, so the update computes
    them from the same detached forward, micro-batch by micro-batch; this holds with
    asynchronous rollouts too (``max_staleness`` >= 1): the old policy is the learner's
    current one whatever weights sampled, and the sampler's log-probs are kept apart.
    """
    return bool(config.skip_old_log_prob_pass and config.num_epochs == 1
                and config.batch_plan().minibatches_per_epoch == 1
                and not config.use_kl_in_reward
                and not getattr(config, "lora_dropout", 0.0))
