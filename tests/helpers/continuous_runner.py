"""A continuous-episode loop on a scripted sampler, without Ray (continuous sampling tests)."""

from __future__ import annotations

from rllib_grpo.envs.tool_arithmetic import ToolArithmeticEnv
from rllib_grpo.rllib.env_runner.episode_sampler import EpisodeSampler
from rllib_grpo.samplers import Sample, SamplingParams
from tests.helpers.scripted_agents import (
    TOKENIZER,
    ScriptedSampler,
)


class FakeStream:
    """A `GenerationStream` stand-in: each request samples the script's answer to its
    prompt one token per step, each token labelled with the version of that step."""

    def __init__(self, script) -> None:
        self.sampler = ScriptedSampler(script)
        self.version = 0
        self.running: dict = {}  # key -> (full sample, tokens so far, versions so far)
        self.submitted: list[tuple] = []

    def submit(self, key, prompt_ids, n, params, seed=None) -> None:
        assert n == 1 and key not in self.running
        self.submitted.append((key, len(prompt_ids), params.max_tokens, seed))
        full = self.sampler.generate([prompt_ids], 1, params)[0][0]
        self.running[key] = (full, [])

    def step(self) -> list:
        finished = []
        for key, (full, versions) in list(self.running.items()):
            versions.append(self.version)
            if len(versions) == len(full.token_ids):
                del self.running[key]
                finished.append((key, [Sample(full.token_ids, full.log_probs,
                                              full.finish_reason, token_versions=versions)]))
        return finished


# --------------------------------------------------------------------------- the loop
class LoopStream(FakeStream):
    """`FakeStream` with the loop's side of a `GenerationStream`: pause/resume, abort."""

    paused = False

    @property
    def num_groups(self) -> int:
        return len(self.running)

    @property
    def num_requests(self) -> int:
        return len(self.running)

    def step(self) -> list:
        return [] if self.paused else super().step()

    def pause(self) -> None:
        self.paused = True

    def resume(self, version: int, partial: bool = True) -> int:
        self.version, self.paused = int(version), False
        return 0

    def abort(self, keys=None) -> list:
        keys = list(self.running) if keys is None else [k for k in keys if k in self.running]
        for key in keys:
            del self.running[key]
        return keys


def fake_runner(script, limits, group_size):
    from types import SimpleNamespace

    from rllib_grpo.rllib.env_runner.env_runner import TextEnvRunner
    from rllib_grpo.samplers.base import CallSeeds

    env = ToolArithmeticEnv(num_problems=20, seed=0, tokenizer=TOKENIZER)
    stream = LoopStream(script)
    sampler = SimpleNamespace(open_stream=lambda version: stream, seeds=CallSeeds(3),
                              seed_requests=True)
    return SimpleNamespace(
        config=SimpleNamespace(group_size=group_size, partial_rollout=True,
                               temperature=1.0, top_p=1.0, top_k=-1,
                               max_response_length=limits.max_response_length),
        sampler=sampler, env=env, tokenizer=TOKENIZER, _weights_seq_no=0, _group_counter=0,
        _episodes=EpisodeSampler(env, stream.sampler, TOKENIZER, limits, seed=7),
        _next_prompt=TextEnvRunner._next_prompt, _overlong_penalty=lambda n, info: 0.0,
        _log_sample_metrics=lambda *a: None, get_metrics=lambda: {},
        sampling_params=lambda: SamplingParams(max_tokens=limits.max_response_length)), stream


def take_all(loop, count):
    groups = []
    for _ in range(200):
        groups += loop.take(wait_s=0.05)["groups"]
        if len(groups) >= count:
            break
    return groups
