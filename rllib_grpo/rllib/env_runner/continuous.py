"""The env runner's side of continuous rollouts (``rollout_mode="continuous"``).

A `RolloutLoop` lives in a `TextEnvRunner` (made on the driver's first ``submit``): a
thread steps the sampler's `rllib_grpo.samplers.stream.GenerationStream` for as long as it
has requests, scores each group the moment its last response ends and queues it; the
driver's calls (Ray actor calls, on the runner's own thread) add prompts, take the
finished groups, and pause / resume the engine around a weight load:

    driver: pause ──► weight sync (the sampler's WeightReceiver / load_weights) ──► resume
    loop:   step step step │ (between two steps: no step runs) │ step step ...

``resume`` labels the tokens sampled from then on with the runner's new weights version
and continues the unfinished responses under the new weights (``partial_rollout=True``)
or samples them again (``False``).  ``suspend`` (before a validation) drops the running
groups and remembers their prompts, which the next ``submit`` or ``resume`` starts again.

The functions at the bottom are what the driver sends (`rllib_grpo.rllib.algorithm.continuous`).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from rllib_grpo.data.rollout import RolloutBatch, build_rollout_batch
from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner, _seek

WAIT_POLL_S = 0.5  # the loop's idle wait between checks of its stop flag


class RolloutLoop:
    """A runner's engine kept busy with the driver's prompt groups (module docstring)."""

    def __init__(self, runner: TextEnvRunner) -> None:
        c = runner.config
        if not hasattr(runner.sampler, "open_stream"):
            raise TypeError(f"rollout_mode='continuous' needs a sampler that steps between "
                            f"decode steps (vLLM); {type(runner.sampler).__name__} does not: "
                            "set sampler='vllm', or rollout_mode='one_step_off'.")
        if runner._episodes is not None:
            raise TypeError("rollout_mode='continuous' runs single-turn envs; this env is "
                            "multi-turn: use rollout_mode='one_step_off' (max_staleness=1).")
        self.runner = runner
        self.stream = runner.sampler.open_stream(runner._weights_seq_no)
        self.params = runner.sampling_params()
        self.group_size = int(c.group_size)
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
        self._pauses, self._pause_s, self._paused_at = 0, 0.0, 0.0
        self._restarted = 0
        self._thread = threading.Thread(target=self._run, name="rollout_loop", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- the driver's calls
    def submit(self, positions: list[int]) -> int:
        """Start one group per data position (and any a suspend dropped); returns the
        groups now running or queued on this runner."""
        positions = self._suspended + list(positions)
        self._suspended = []
        with self._env:
            prompts = []
            for position in positions:
                _seek(self.runner.env, position)
                prompts.append(self.runner._next_prompt(self.runner.env))
        sampler: Any = self.runner.sampler  # a VLLMSampler (checked in __init__)
        with self._engine:
            for position, prompt in zip(positions, prompts, strict=True):
                key = self.runner._group_counter
                self.runner._group_counter += 1
                seed = sampler.seeds.next(self.params) if sampler.seed_requests else None
                self.stream.submit(key, prompt["prompt_token_ids"], self.group_size,
                                   self.params, seed)
                self._positions[key] = position
                self._prompts[key] = prompt
        with self._cond:
            self._cond.notify_all()
        return self.stream.num_groups + len(self._done)

    def take(self, wait_s: float) -> dict[str, Any]:
        """The finished groups (waiting up to ``wait_s`` for a first one), each with its data
        position, and this runner's counters since the last take."""
        with self._cond:
            if not self._done and wait_s > 0:
                self._cond.wait_for(lambda: bool(self._done), timeout=wait_s)
            done = list(self._done)
            self._done.clear()
            busy, idle, score = self._busy_s, self._idle_s, self._score_s
            self._busy_s = self._idle_s = self._score_s = 0.0
        if done:
            self.runner._log_sample_metrics(sum(len(b) for _, b in done), busy, score)
        return {"groups": done, "busy_s": busy + score, "idle_s": idle,
                "running": self.stream.num_groups, "metrics": self.runner.get_metrics()}

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
        self._pauses += 1
        self._pause_s += seconds
        self._restarted += restarted
        if self._suspended:  # a validation's suspend: its groups start again
            self.submit([])
        return {"pause_s": seconds, "restarted_requests": float(restarted)}

    def suspend(self) -> None:
        """Drop the running groups (their prompts start again at the next ``submit``) and
        pause: the engine is free for a validation's own requests."""
        self.pause()
        with self._engine:
            dropped = self.stream.abort()
        self._suspended += [self._positions.pop(key) for key in dropped]
        for key in dropped:
            self._prompts.pop(key, None)

    def reset(self) -> None:
        """Forget everything in flight (a restore): running groups, queued ones, suspended."""
        self.suspend()
        self._suspended = []
        with self._cond:
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
                finished = [] if self._paused else self.stream.step()
            t1 = time.perf_counter()
            batches = [(self._positions.pop(key), self._score(key, samples))
                       for key, samples in finished]
            with self._cond:  # (take reads and resets the counters under it)
                self._busy_s += t1 - t0
                self._score_s += time.perf_counter() - t1
                self._done.extend(batches)
                self._cond.notify_all()

    def _score(self, key: int, samples: list) -> RolloutBatch:
        """One finished group as a `RolloutBatch` (scored as `TextEnvRunner.sample` scores)."""
        runner, prompt = self.runner, self._prompts.pop(key)
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

    def counters(self) -> dict[str, float]:
        """Pauses so far, their seconds and the responses restarted by them."""
        return {"pauses": float(self._pauses), "pause_s": self._pause_s,
                "restarted_requests": float(self._restarted)}


# --------------------------------------------------------------------------- driver calls
def rollout_loop(runner: TextEnvRunner) -> RolloutLoop:
    """The runner's loop, made on first use."""
    loop = getattr(runner, "rollout_loop", None)
    if loop is None:
        loop = runner.rollout_loop = RolloutLoop(runner)
    return loop


def loop_submit(runner: TextEnvRunner, work: dict[int, list[int]]) -> tuple[int, int]:
    return runner.worker_index, rollout_loop(runner).submit(work.get(runner.worker_index, []))


def loop_take(runner: TextEnvRunner, wait_s: float) -> tuple[int, dict[str, Any]]:
    return runner.worker_index, rollout_loop(runner).take(wait_s)


def loop_pause(runner: TextEnvRunner) -> int:
    rollout_loop(runner).pause()
    return runner.worker_index


def loop_resume(runner: TextEnvRunner) -> tuple[int, dict[str, float]]:
    return runner.worker_index, rollout_loop(runner).resume()


def loop_suspend(runner: TextEnvRunner) -> int:
    rollout_loop(runner).suspend()
    return runner.worker_index


def loop_reset(runner: TextEnvRunner) -> int:
    loop = getattr(runner, "rollout_loop", None)
    if loop is not None:
        loop.reset()
    return runner.worker_index
