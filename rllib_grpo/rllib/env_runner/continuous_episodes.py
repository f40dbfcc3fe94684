"""Multi-turn episodes in the continuous rollout loop: a turn is a request.

A `RolloutLoop` (`rllib_grpo.rllib.env_runner.rollout_loop`) with a multi-turn env hands its
groups to `EpisodeGroups`: a group is ``group_size`` episodes of one prompt, and each
episode's model turn is one request of the loop's `GenerationStream`, keyed
``(group key, episode index, turn)``.  When a turn's response ends, the env plays it (tool
calls, observation, reward: `EpisodeSampler.play_turn`, the same code as the synchronous
path, so the episode's tokens, loss mask, rewards and limits are built exactly as there)
and, unless the episode is done, its next turn is submitted as a new request whose prompt
is the episode's whole context (prompt, earlier turns and env replies).  A group is
finished, scored and queued when all its episodes are done (`EpisodeSampler.to_batch`).

Seeds are the synchronous path's: a group's first turns are request ``j`` of the group
(seed ``s + j`` of the call seed ``s``), later turns are seeded by (episode seed, turn).
Versions: every model token carries the version that sampled it; an episode's turns may
span weight updates (a turn in flight at an update continues, or restarts, under the new
weights as any request does; earlier turns keep their versions).  Env tokens are not
sampled: they carry the version of the model token before them and have loss mask 0, so
an episode's version (``weights_version``) is its oldest sampled token's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from rllib_grpo.data.rollout import RolloutBatch
from rllib_grpo.rllib.env_runner.episode_sampler import EpisodeSampler, LiveEpisode
from rllib_grpo.samplers import Sample, SamplingParams

# A request for the stream: (stream key, prompt token ids, params, seed).
TurnRequest = tuple[tuple[int, int, int], list[int], SamplingParams, "int | None"]


class EpisodeGroups:
    """The multi-turn groups of a rollout loop while they run (module docstring).

    Not thread-safe: the loop calls it under its env lock (the env is stepped here)."""

    def __init__(self, episodes: EpisodeSampler, group_size: int, params: SamplingParams, *,
                 pad_token_id: int, score_adjustment: Callable[[int, dict], float]) -> None:
        self.episodes = episodes
        self.group_size = int(group_size)
        self.params = params
        self.pad_token_id = pad_token_id
        self.score_adjustment = score_adjustment
        self._live: dict[int, list[LiveEpisode]] = {}  # group key -> its episodes

    @property
    def num_groups(self) -> int:
        """Groups with an episode still running."""
        return len(self._live)

    def start(self, key: int, prompt: dict[str, Any], seed: int | None) -> list[TurnRequest]:
        """Start the group ``key`` of ``prompt``; the requests of its episodes' first turns
        (episode ``j`` seeded ``seed + j``, as request ``j`` of a group; None: unseeded)."""
        if key in self._live:
            raise KeyError(f"group {key!r} is already running")
        live = self._live[key] = self.episodes.start_episodes([prompt], [key], self.group_size)
        return [self._request(key, j, e, None if seed is None else seed + j)
                for j, e in enumerate(live)]

    def _request(self, key: int, index: int, episode: LiveEpisode,
                 seed: int | None) -> TurnRequest:
        t = episode.trajectory
        return ((key, index, t.num_turns), t.context_ids(),
                self.episodes.turn_params(episode, self.params), seed)

    def advance(self, finished: Iterable[tuple[Any, list[Sample]]]
                ) -> tuple[list[TurnRequest], list[tuple[int, RolloutBatch]]]:
        """Play the turns that ended (``(stream key, [sample])`` from the stream's ``step``;
        the env steps them all at once); the next turns' requests, and the groups whose
        episodes are now all done, as `RolloutBatch` es."""
        ended: list[tuple[int, int, LiveEpisode, Sample]] = []
        for (key, index, _turn), samples in finished:
            live = self._live.get(key)
            if live is not None:  # (else dropped while its turn ran)
                ended.append((key, index, live[index], samples[0]))
        if not ended:
            return [], []
        self.episodes.play_turn([e for _, _, e, _ in ended], [s for _, _, _, s in ended])
        requests = [self._request(key, index, e, self.episodes.turn_seed(e))
                    for key, index, e, _ in ended if not e.done]
        done = []
        for key in dict.fromkeys(key for key, _, _, _ in ended):
            live = self._live[key]
            if all(e.done for e in live):
                del self._live[key]
                done.append((key, self.episodes.to_batch(
                    live, pad_token_id=self.pad_token_id,
                    score_adjustment=self.score_adjustment)))
        return requests, done

    def drop(self) -> None:
        """Forget every running group (a suspend or a restore)."""
        self._live.clear()
