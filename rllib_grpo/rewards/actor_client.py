"""`ActorPoolReward`: the env runner's side of the reward actors (reward models, judges).

The algorithm starts, per model reward, ``num_reward_workers`` named Ray actors
(`rllib_grpo.rllib.algorithm.reward_workers`); an env runner looks them up by name and
sends each batch it scores to one of them, in turn, in a single call (the actor splits it
into forward passes of ``reward_batch_size`` samples).  Faults:

* the actor dies (its process killed, its node lost): Ray restarts it (``max_restarts=-1``)
  and the same batch is sent again, up to ``max_attempts`` times;
* the call overruns ``timeout_s``: the actor is named (``report_stuck``: its node, pid and
  GPU ids, and the file the stacks of the run's processes went to, taken before the kill),
  killed (Ray restarts it, so a hung model does not block the calls queued behind it) and
  the batch raises `TimeoutError` with that line, which the mixture scores 0 and counts,
  as a reward function that hangs.

Needs Ray; no torch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

logger = logging.getLogger(__name__)
DEFAULT_MAX_ATTEMPTS = 3


class ActorPoolReward:
    """Scores batches on named reward actors (module docstring).

    Args:
        actor_names: the actors' Ray names (looked up lazily, in the caller's namespace).
        timeout_s: seconds one batch call may take.
        max_attempts: calls of one batch when actors die under it.
        first: index of the actor the first batch goes to (env runners start apart).
        report_stuck: ``report_stuck(message, name, handle)`` -> the line naming a call
            that overran ``timeout_s`` (the env runner's: the actor's whereabouts and the
            stack file); None: ``message`` alone.
    """

    def __init__(self, actor_names: Sequence[str], *, timeout_s: float = 300.0,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS, first: int = 0,
                 report_stuck: Callable[[str, str, Any], str] | None = None) -> None:
        if not actor_names:
            raise ValueError("ActorPoolReward needs at least one actor name")
        self.actor_names = list(actor_names)
        self.timeout_s = timeout_s
        self.max_attempts = max(1, max_attempts)
        self._next = first % len(self.actor_names)
        self.report_stuck = report_stuck
        self._handles: dict[str, Any] = {}
        self.num_calls = 0
        self.num_timeouts = 0
        self.num_actor_deaths = 0
        self.wait_seconds = 0.0

    def _handle(self, name: str) -> Any:
        import ray

        if name not in self._handles:
            self._handles[name] = ray.get_actor(name)
        return self._handles[name]

    def score_batch(self, prompts: Sequence[Any], responses: Sequence[str],
                    ground_truths: Sequence[Any]) -> list[Any]:
        """One call to one actor for the whole batch; its scores in order."""
        import ray
        from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError

        name = self.actor_names[self._next]
        self._next = (self._next + 1) % len(self.actor_names)
        args = (list(prompts), list(responses), list(ground_truths))
        t0 = time.perf_counter()
        try:
            for attempt in range(1, self.max_attempts + 1):
                handle = self._handle(name)
                self.num_calls += 1
                ref = handle.score.remote(*args)
                try:
                    return ray.get(ref, timeout=self.timeout_s)
                except GetTimeoutError as err:
                    self.num_timeouts += 1
                    message = (f"reward actor {name} did not answer within "
                               f"{self.timeout_s:g} s for {len(responses)} samples "
                               "(reward_model_timeout_s): restarted, the batch scored 0")
                    if self.report_stuck is not None:  # before the kill: its stack
                        message = self.report_stuck(message, name, handle)
                    ray.kill(handle, no_restart=False)  # restarted: calls behind it go on
                    raise TimeoutError(message) from err
                except (RayActorError, ActorUnavailableError) as err:
                    self.num_actor_deaths += 1
                    logger.warning("reward actor %s died during a call (attempt %d of %d); "
                                   "Ray restarts it and the batch is scored again: %s",
                                   name, attempt, self.max_attempts, err)
                    if attempt == self.max_attempts:
                        raise
                    self._handles.pop(name, None)  # look it up again once restarted
                    self._wait_alive(name)
            raise AssertionError("unreachable")
        finally:
            self.wait_seconds += time.perf_counter() - t0

    def _wait_alive(self, name: str) -> None:
        """Wait (up to ``timeout_s``) until the restarted actor answers."""
        import ray
        from ray.exceptions import ActorUnavailableError, RayActorError

        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            try:
                ray.get(self._handle(name).ready.remote(), timeout=max(
                    0.1, deadline - time.monotonic()))
                return
            except (RayActorError, ActorUnavailableError, ValueError):  # still restarting
                self._handles.pop(name, None)
                time.sleep(0.2)

    def get_state(self) -> dict[str, int]:
        """Counters."""
        return {"num_calls": self.num_calls, "num_timeouts": self.num_timeouts,
                "num_actor_deaths": self.num_actor_deaths}
