"""The sampler contract shared by the vLLM and transformers samplers.

A sampler turns prompt token ids into groups of sampled responses with the
log-probability of every sampled token under the *sampling* distribution
("processed" log-probs): ``log_softmax(logits / temperature)`` after top-k and
top-p filtering.  With ``top_p=1`` and ``top_k=-1`` these equal what a trainer
computes with a forward pass at the same temperature (the tests check each sampler against
one, tests/helpers/log_probs.py).

New weights come as a state dict (``load_weights``: the learner's live tensors, views of
the node's shared weights file, or a state dict from Ray's object store); a vLLM engine on
GPUs also takes them through vLLM's own weight-transfer engines
(`rllib_grpo.samplers.vllm_weights`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

import torch

logger = logging.getLogger(__name__)

FinishReason = Literal["stop", "length"]


@dataclass
class SamplingParams:
    """How to sample.  ``temperature=0`` is greedy; ``top_k=-1`` and ``top_p=1`` disable filtering.

    ``seed`` makes one ``generate`` call reproducible; ``None`` draws from the
    sampler's own seeded stream.  ``stop_token_ids`` end a response like EOS
    does (and, like EOS, are kept in it).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    seed: int | None = None
    stop_token_ids: list[int] | None = None


@dataclass
class Sample:
    """One response: its token ids, their processed log-probs, and why it ended.

    ``finish_reason`` is ``"stop"`` when EOS or a stop token was sampled (that
    token is the last of ``token_ids``, as verl's responses include EOS) and
    ``"length"`` when ``max_tokens`` ran out.
    """

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    # Per token: the weights version that sampled it (continuous rollouts, where weights
    # change mid-response); None where one call has one version.
    token_versions: list[int] | None = None


@runtime_checkable
class Sampler(Protocol):
    """Generates groups of responses and takes new weights from the learner."""

    @property
    def device(self) -> torch.device:
        """Where the sampler's weights live (only the type counts: ``cpu`` or ``cuda``)."""
        ...

    @property
    def weight_dtype(self) -> torch.dtype:
        """The dtype the weights should travel in (the sampler's own)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams,
        *, seeds: Sequence[int] | None = None, images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples for each prompt: the outer list follows ``prompts``.

        ``seeds`` (one per prompt, optional) seed the prompts' requests instead of
        the call's seed: multi-turn episodes keep their own seed whatever else is
        in the batch (vLLM: per request; transformers: the call is seeded from all
        of them, so the same set of episodes gives the same samples).
        ``images`` (one sequence of PIL images per prompt, optional; a vision-language
        model's): the prompt's images, whose tokens its ids hold expanded (one per merged
        patch, `rllib_grpo.models.vision.ImagePromptProcessor`).
        """
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> dict[str, float]:
        """Replace the weights (HF parameter names); return ``{"bytes", "seconds"}``."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Free accelerator memory between sampling phases (a no-op where unsupported):
        level 1 keeps the weights in host memory, level 2 discards them."""
        ...

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Undo ``sleep`` for the memory of ``tags`` (vLLM's ``"weights"``,
        ``"kv_cache"``; None: all)."""
        ...

    def close(self) -> None:
        """Release the engine and its memory."""
        ...


def cut_before(sample: Sample, token_ids: frozenset[int]) -> Sample:
    """``sample`` ended before the first of ``token_ids`` it holds (its tokens and
    log-probs up to there kept, finish reason ``"length"``: a truncation).

    A vision-language model's forward puts image features wherever its image placeholder
    token stands, so a response may not contain one: the learner could not score it.  The
    kept prefix was sampled from the policy as it is, so its log-probs stay exact."""
    for i, token_id in enumerate(sample.token_ids):
        if token_id in token_ids:
            versions = None if sample.token_versions is None else sample.token_versions[:i]
            return Sample(sample.token_ids[:i], sample.log_probs[:i], "length", versions)
    return sample


class CallSeeds:
    """The seed of each ``generate`` call: ``params.seed`` when set, else the next of a
    stream derived from the sampler's seed, so that a run is reproducible
    whatever else draws from the global RNGs."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.calls = 0

    def next(self, params: SamplingParams) -> int:
        if params.seed is not None:
            return params.seed
        self.calls += 1
        return (self.seed * 1_000_003 + self.calls) % 2**31


def combined_seed(seeds: Sequence[int]) -> int:
    """One seed from several (order matters): a call seeded by all its requests' seeds."""
    value = 0
    for seed in seeds:
        value = (value * 1_000_003 + int(seed)) % 2**61
    return value % 2**31


def runner_device() -> torch.device:
    """The device a sampler takes when none is given: the GPU this process holds, else the
    CPU.  Ray hides the GPUs an actor did not reserve (``CUDA_VISIBLE_DEVICES``), so a
    CUDA device here is the env runner's own."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def state_dict_bytes(state_dict: Mapping[str, torch.Tensor]) -> int:
    """Bytes held by the tensors of a state dict."""
    return sum(t.numel() * t.element_size() for t in state_dict.values())
