"""Continuous generation on one in-process vLLM engine: requests come and go one engine
step at a time, and new weights load between two steps.

`GenerationStream` is what a continuous rollout (``rollout_mode="continuous"``) drives:

* ``submit(key, prompt, n, params, seed)`` adds one group (``n`` requests of one prompt);
* ``step()`` runs one engine step (one decode step for every running request, plus any
  prefill the scheduler fits) and returns the groups whose last response ended;
* ``pause()`` / ``resume(version, partial)`` bracket a weight load.  ``pause`` stops the
  engine's scheduler between two steps (vLLM's ``pause_scheduler(mode="keep")``); the
  caller loads the weights (the driver's weight sync: ``load_weights`` or vLLM's API);
  ``resume`` labels the tokens sampled from then on with ``version`` (vLLM's
  ``update_weight_version``) and restarts every unfinished request:
  ``partial=True`` continues it under the new weights (a *partial rollout*: the request
  is aborted and re-submitted as prompt + its tokens so far, with the prefix cache
  dropped, so the KV cache of the prompt and those tokens is recomputed by the new weights
  and every later token's log-prob is exactly the new policy's), ``partial=False`` samples it again from its prompt.  Every token of
  a response carries the version that sampled it (``Sample.token_versions``) and its
  log-prob under that version;
* ``abort(keys)`` drops groups.

Outputs stream as deltas (vLLM's ``RequestOutputKind.DELTA``): the stream keeps each
request's tokens, log-probs and versions itself.  The engine is stepped by the caller (no
thread here): the env runner's loop (`rllib_grpo.rllib.env_runner.rollout_loop`) holds a lock
around each ``step`` and each weight load, so a load never lands inside a step.  vLLM is
reached through the `VLLMSampler` that owns the engine; nothing here imports vLLM at module
import.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any

from rllib_grpo.samplers.base import Sample, SamplingParams


@dataclass
class _Request:
    """One response while it runs: what it sampled so far, under which versions."""

    key: Any
    index: int  # the sample's place in its group
    prompt_ids: list[int]
    params: SamplingParams
    seed: int | None
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    restarts: int = 0


@dataclass
class _Group:
    """One prompt's ``n`` responses while they run."""

    key: Any
    request_ids: set[str]
    done: dict[int, Sample] = field(default_factory=dict)
    size: int = 0


class GenerationStream:
    """Continuous batching of prompt groups on a `VLLMSampler`'s engine (see the module
    docstring).  ``version`` labels the weights the engine holds now."""

    def __init__(self, sampler: Any, version: int = 0) -> None:
        from vllm.sampling_params import RequestOutputKind

        self._delta = RequestOutputKind.DELTA
        self.sampler = sampler
        self.llm = sampler.llm
        self.engine = self.llm.llm_engine
        self._groups: dict[Any, _Group] = {}
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        self.paused = False
        self.version = int(version)
        self.llm.update_weight_version(str(self.version))
        self.restarted_requests = 0  # requests continued or sampled again after a load

    # ---------------------------------------------------------------- requests
    def submit(self, key: Any, prompt_ids: list[int], n: int, params: SamplingParams,
               seed: int | None = None) -> None:
        """Add a group of ``n`` responses to ``prompt_ids`` under ``key`` (sample ``j``
        seeded ``seed + j`` when ``seed`` is given, as vLLM seeds a request's ``n``)."""
        if key in self._groups:
            raise KeyError(f"group {key!r} is already running")
        group = _Group(key, set(), size=n)
        self._groups[key] = group
        for j in range(n):
            request = _Request(key, j, list(prompt_ids), params,
                               None if seed is None else seed + j)
            group.request_ids.add(self._add(request))

    def _add(self, request: _Request) -> str:
        """Start ``request`` where it stands: its prompt plus the tokens it has so far."""
        done = len(request.token_ids)
        params = dataclasses.replace(request.params, max_tokens=request.params.max_tokens - done)
        # A continuation draws its own seeded stream (the seed moved by the restart count).
        seed = None if request.seed is None else request.seed + 7919 * request.restarts
        vllm_params = self.sampler._request_params(params, 1, seed=seed)
        vllm_params.output_kind = self._delta
        request_id = f"grpo-stream-{next(self._ids)}"
        engine_input = self.llm._preprocess_cmpl_one(
            {"prompt_token_ids": request.prompt_ids + request.token_ids})
        self.engine.add_request(request_id, engine_input, vllm_params)
        self._requests[request_id] = request
        return request_id

    def abort(self, keys: list[Any] | None = None) -> list[Any]:
        """Drop the groups ``keys`` (None: all); returns the keys dropped."""
        keys = list(self._groups) if keys is None else [k for k in keys if k in self._groups]
        request_ids = [r for k in keys for r in self._groups[k].request_ids]
        if request_ids:
            self.engine.abort_request(request_ids)
        for request_id in request_ids:
            self._requests.pop(request_id, None)
        for k in keys:
            del self._groups[k]
        return keys

    @property
    def num_groups(self) -> int:
        """Groups submitted and not finished."""
        return len(self._groups)

    @property
    def num_requests(self) -> int:
        """Responses still being sampled."""
        return len(self._requests)

    def step(self) -> list[tuple[Any, list[Sample]]]:
        """One engine step; the groups it finished, as ``(key, samples in order)``."""
        if self.paused or not self._requests:
            return []
        with self.sampler._eager_on_cpu():
            outputs = self.engine.step()
        finished = []
        for output in outputs:
            request = self._requests.get(output.request_id)
            if request is None:
                continue
            completion = output.outputs[0]
            new_ids = list(completion.token_ids)
            request.token_ids += new_ids
            request.log_probs += [position[token_id].logprob for token_id, position
                                  in zip(new_ids, completion.logprobs or [], strict=True)]
            request.versions += [self.version] * len(new_ids)
            if not output.finished:
                continue
            del self._requests[output.request_id]
            group = self._groups[request.key]
            group.request_ids.discard(output.request_id)
            group.done[request.index] = Sample(
                request.token_ids, request.log_probs,
                "stop" if completion.finish_reason == "stop" else "length",
                token_versions=request.versions)
            if len(group.done) == group.size:
                del self._groups[request.key]
                finished.append((request.key, [group.done[i] for i in range(group.size)]))
        return finished

    # ---------------------------------------------------------------- weights in flight
    def pause(self) -> None:
        """Stop scheduling between two engine steps (vLLM's ``pause_scheduler(mode="keep")``
        where the engine runs in this process)."""
        if self.paused:
            return
        core = getattr(self.engine.engine_core, "engine_core", None)
        if core is not None and hasattr(core, "pause_scheduler"):
            core.pause_scheduler(mode="keep", clear_cache=False)
        self.paused = True

    def resume(self, version: int, partial: bool = True) -> int:
        """Label the tokens sampled from now on ``version``, restart the unfinished
        requests (``partial``: continued from their tokens so far; else sampled again from
        their prompt) and schedule again.  Returns how many requests were restarted."""
        restarted = 0
        if int(version) != self.version:
            self.version = int(version)
            self.llm.update_weight_version(str(self.version))
            running = list(self._requests.items())
            if running:
                self.engine.abort_request([request_id for request_id, _ in running])
            # The aborted requests' full KV blocks went to the prefix cache; the old weights
            # computed them, so a continuation must not find them (nothing runs now: the
            # reset cannot fail on blocks in use).
            if not self.llm.reset_prefix_cache():
                raise RuntimeError("vLLM kept its prefix cache across a weight update "
                                   "(blocks still in use): continuations would reuse old KV.")
            for request_id, request in running:
                del self._requests[request_id]
                group = self._groups[request.key]
                group.request_ids.discard(request_id)
                if not partial:
                    request.token_ids, request.log_probs, request.versions = [], [], []
                request.restarts += 1
                group.request_ids.add(self._add(request))
            restarted = len(running)
            self.restarted_requests += restarted
        core = getattr(self.engine.engine_core, "engine_core", None)
        if self.paused and core is not None and hasattr(core, "resume_scheduler"):
            core.resume_scheduler()
        self.paused = False
        return restarted
