"""The env runner's side of continuous rollouts (``rollout_mode="continuous"``).

A `RolloutLoop` lives in a `TextEnvRunner` (made on the driver's first ``submit``): a
thread steps the sampler's `rllib_grpo.samplers.stream.GenerationStream` for as long as it
has requests, scores each group the moment its last response ends and queues it; the
driver's calls (Ray actor calls, on the runner's own thread) add prompts, take the
finished groups, and pause / resume the engine around a weight load:

    driver: pause ──► weight sync (the driver's: load_weights / vLLM's API) ──► resume
    loop:   step step step │ (between two steps: no step runs) │ step step ...

``resume`` labels the tokens sampled from then on with the runner's new weights version
and continues the unfinished responses under the new weights (``partial_rollout=True``)
or samples them again (``False``).  With a multi-turn env a group is ``group_size``
episodes and each model turn one request (`rllib_grpo.rllib.env_runner.continuous_episodes`):
the env plays a turn as soon as it ends, and the group is queued when its episodes are done.  ``suspend`` (before a validation) drops the running
groups and remembers their prompts, which the next ``submit`` or ``resume`` starts again.

The functions at the bottom are what the driver sends (`rllib_grpo.rllib.algorithm.sampling.continuous`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

import numpy as np

from rllib_grpo.data.rollout import RolloutBatch, build_rollout_batch
from rllib_grpo.rllib.env_runner.continuous_episodes import EpisodeGroups
from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner, _seek

logger = logging.getLogger(__name__)

WAIT_POLL_S = 0.5  # the loop's idle wait between checks of its stop flag


class RolloutLoop:
    """A runner's engine kept busy with the driver's prompt groups (module docstring)."""

    def __init__(self, runner: TextEnvRunner) -> None:
        c = runner.config
        if not hasattr(runner.sampler, "open_stream"):
            raise TypeError(f"rollout_mode='continuous' needs a sampler that steps between "
                            f"decode steps (vLLM); {type(runner.sampler).__name__} does not: "
                            "set sampler='vllm', or rollout_mode='one_step_off'.")
        self.runner = runner
        self.stream = runner.sampler.open_stream(runner._weights_seq_no)
        self.params = runner.sampling_params()
        self.group_size = int(c.group_size)
        # A multi-turn env: a group is group_size episodes, a turn one request.
        self.episodes = None if runner._episodes is None else EpisodeGroups(
            runner._episodes, self.group_size, self.params,
            pad_token_id=runner.tokenizer.pad_token_id or 0,
            score_adjustment=runner._overlong_penalty)
        self.partial_rollout = bool(getattr(c, "partial_rollout", True))
        self._engine = threading.Lock()  # one engine step, submit or weight load at a time
        self._env = threading.Lock()  # prompts read vs responses scored (one env)
        self._cond = threading.Condition()
        self._positions: dict[int, int] = {}  # group key -> data position
        self._prompts: dict[int, dict[str, Any]] = {}  # group key -> its prompt
        self._suspended: list[int] = []  # positions dropped by a suspend, to start again
        self._done: deque[tuple[int, RolloutBatch]] = deque()
        self._paused = False
        self._stop = False
        self._busy_s = self._idle_s = self._score_s = 0.0
        self._paused_at = 0.0
        # A reset (a restore) starts a new epoch: groups the loop claimed before it are
        # dropped, never queued after it.  A loop that dies says so at the next take.
        self._epoch = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="rollout_loop", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the driver's calls
    def submit(self, positions: list[int]) -> int:
        """Start one group per data position (and any a suspend dropped); returns the
        groups now running or queued on this runner."""
        positions = self._suspended + list(positions)
        self._suspended = []
        sampler: Any = self.runner.sampler  # a VLLMSampler (checked in __init__)
        with self._env:
            prompts, turns = [], []
            for position in positions:
                _seek(self.runner.env, position)
                prompts.append(self.runner._next_prompt(self.runner.env))
            keys = list(range(self.runner._group_counter,
                              self.runner._group_counter + len(positions)))
            self.runner._group_counter += len(positions)
            seeds = [sampler.seeds.next(self.params) if sampler.seed_requests else None
                     for _ in positions]
            if self.episodes is not None:  # (starting an episode reads the env)
                turns = [request for key, prompt, seed in zip(keys, prompts, seeds, strict=True)
                         for request in self.episodes.start(key, prompt, seed)]
        with self._engine:
            for key, position, prompt, seed in zip(keys, positions, prompts, seeds,
                                                   strict=True):
                if self.episodes is None:
                    self.stream.submit(key, prompt["prompt_token_ids"], self.group_size,
                                       self.params, seed)
                    self._prompts[key] = prompt
                self._positions[key] = position
            for stream_key, context, params, seed in turns:
                self.stream.submit(stream_key, context, 1, params, seed)
        with self._cond:
            self._cond.notify_all()
        return self.running_groups + len(self._done)

    @property
    def running_groups(self) -> int:
        """Groups submitted and not finished."""
        return self.stream.num_groups if self.episodes is None else self.episodes.num_groups

    def take(self, wait_s: float) -> dict[str, Any]:
        """The finished groups (waiting up to ``wait_s`` for a first one), each with its data
        position, and this runner's counters since the last take."""
        with self._cond:
            if not self._done and wait_s > 0:
                self._cond.wait_for(lambda: bool(self._done) or self._error is not None,
                                    timeout=wait_s)
            if self._error is not None:  # the driver would otherwise wait forever
                raise RuntimeError("rollout_mode='continuous': this env runner's rollout "
                                   f"loop died: {self._error!r}") from self._error
            done = list(self._done)
            self._done.clear()
            busy, idle, score = self._busy_s, self._idle_s, self._score_s
            self._busy_s = self._idle_s = self._score_s = 0.0
        if done:
            self.runner._log_sample_metrics(sum(len(b) for _, b in done), busy, score)
        return {"groups": done, "busy_s": busy + score, "idle_s": idle,
                "running": self.running_groups, "metrics": self.runner.get_metrics()}

    def pause(self) -> None:
        """Stop between two engine steps (the running responses keep their place)."""
        with self._cond:
            self._paused = True
        with self._engine:  # the step under way ends first
            self.stream.pause()
        self._paused_at = time.perf_counter()

    def resume(self) -> dict[str, float]:
        """Label the next tokens with the runner's weights version, continue (or restart)
        the unfinished responses and step again; returns the pause's cost."""
        with self._engine:
            restarted = self.stream.resume(self.runner._weights_seq_no,
                                           partial=self.partial_rollout)
        with self._cond:
            self._paused = False
            self._cond.notify_all()
        seconds = time.perf_counter() - self._paused_at
        if self._suspended:  # a validation's suspend: its groups start again
            self.submit([])
        return {"pause_s": seconds, "restarted_requests": float(restarted)}

    def suspend(self) -> None:
        """Drop the running groups (their prompts start again at the next ``submit``) and
        pause: the engine is free for a validation's own requests."""
        self.pause()
        with self._engine:
            dropped = self.stream.abort()
            if self.episodes is not None:  # every unfinished group (some between turns)
                dropped = list(self._positions)
            self._suspended += [self._positions.pop(key) for key in dropped]
        for key in dropped:
            self._prompts.pop(key, None)
        if self.episodes is not None:
            with self._env:
                self.episodes.drop()

    def reset(self) -> None:
        """Forget everything in flight (a restore): running groups, queued ones, suspended."""
        self.suspend()
        self._suspended = []
        with self._engine:  # (the loop claims finished groups under it)
            with self._cond:
                self._epoch += 1
                self._done.clear()
            self._positions.clear()
            self._prompts.clear()
        self.resume()

    def close(self) -> None:
        """Stop the thread (before the sampler closes)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    # ---------------------------------------------------------------- the loop
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as error:  # noqa: BLE001 - reported by the next take
            logger.exception("rollout loop died")
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                t0 = time.perf_counter()
                while not self._stop and (self._paused or not self.stream.num_requests):
                    self._cond.wait(WAIT_POLL_S)
                self._idle_s += time.perf_counter() - t0
                if self._stop:
                    return
            t0 = time.perf_counter()
            with self._engine:
                epoch = self._epoch
                finished = [] if self._paused else self.stream.step()
                # Claimed under the engine lock: a suspend or reset after this point sees
                # these groups gone from _positions (a reset's epoch then drops them).
                claimed = [] if self.episodes is not None else [
                    (self._positions.pop(key, None), self._prompts.pop(key, None), key, samples)
                    for key, samples in finished]
            t1 = time.perf_counter()
            batches = ([(position, self._score(key, prompt, samples))
                        for position, prompt, key, samples in claimed
                        if position is not None and prompt is not None]
                       if self.episodes is None else self._play_turns(finished))
            with self._cond:  # (take reads and resets the counters under it)
                self._busy_s += t1 - t0
                self._score_s += time.perf_counter() - t1
                if epoch == self._epoch:
                    self._done.extend(batches)
                self._cond.notify_all()

    def _play_turns(self, finished: list) -> list[tuple[int, RolloutBatch]]:
        """Multi-turn: the env plays the turns that ended, the next turns start, and the
        groups whose episodes are all done come back with their data positions."""
        assert self.episodes is not None
        with self._env:
            requests, done = self.episodes.advance(finished)
        batches = []
        with self._engine:  # a group dropped meanwhile (suspend) is not in _positions
            for stream_key, context, params, seed in requests:
                if stream_key[0] in self._positions:
                    self.stream.submit(stream_key, context, 1, params, seed)
            for key, batch in done:
                position = self._positions.pop(key, None)
                if position is not None:
                    batches.append((position, batch))
        return batches

    def _score(self, key: int, prompt: dict[str, Any], samples: list) -> RolloutBatch:
        """One finished group as a `RolloutBatch` (scored as `TextEnvRunner.sample` scores)."""
        runner = self.runner
        with self._env:
            infos = runner._score_many(runner.env, [(prompt, s.token_ids) for s in samples])
        for sample, info in zip(samples, infos, strict=True):
            info["reward"] += runner._overlong_penalty(len(sample.token_ids), info)
        n = len(samples)
        batch = build_rollout_batch(
            [prompt["prompt_token_ids"]] * n, [list(s.token_ids) for s in samples],
            [list(s.log_probs) for s in samples], [float(i["reward"]) for i in infos],
            [key] * n, [s.finish_reason == "length" for s in samples],
            [bool(i.get("reward_error", False)) for i in infos], infos,
            pad_token_id=runner.tokenizer.pad_token_id or 0)
        versions = np.zeros(batch.response_ids.shape, dtype=np.int64)
        for row, sample in enumerate(samples):
            versions[row, :len(sample.token_ids)] = sample.token_versions
        batch.token_versions = versions
        # A response's version is its oldest token's (its staleness is the largest).
        batch.weights_version[:] = [min(s.token_versions, default=self.stream.version)
                                    for s in samples]
        return batch


# --------------------------------------------------------------------------- driver calls
def rollout_loop(runner: TextEnvRunner) -> RolloutLoop:
    """The runner's loop, made on first use (the driver calls its methods through it)."""
    loop = getattr(runner, "rollout_loop", None)
    if loop is None:
        loop = runner.rollout_loop = RolloutLoop(runner)
    return loop
