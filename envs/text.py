"""``TextEnv``: one episode is one prompt and one response, scored by a reward function.

``reset()`` serves the next prompt of a seeded, per-epoch shuffled order (or a
chosen one with ``options={"index": i}``, which does not advance the order, so
a GRPO group of ``n`` episodes can share a prompt). ``step(response_text)``
scores the response and ends the episode. The observation is the rendered
prompt text; the ground truth is only in ``info``.

Multi-turn: ``step`` asks :meth:`TextEnv._next_turn` for a follow-up
observation; the default returns None (single turn, ``terminated=True``). A
multi-turn env overrides it to return the next user turn (e.g. tool output) and
ends the episode by returning None.

Images: a dataset whose prompts carry images (`rllib_grpo.data.images`) needs the
vision-language model's ``processor`` (`rllib_grpo.models.vision.ImagePromptProcessor`).
Its observations are ``{"text": rendered prompt, "images": (PIL images, ...)}``, every turn
of an episode keeping its images; ``info["prompt_token_ids"]`` has every image's tokens
expanded and ``info["multi_modal_inputs"]`` the processor's vision inputs (what the
learner's forward takes).
"""

from __future__ import annotations

import inspect
import string
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np

from rllib_grpo.envs.datasets import (
    TRUNCATION_MODES,
    PromptDataset,
    PromptRecord,
    apply_length_limit,
    load_prompts,
    prompt_token_lengths,
    render_and_encode,
    render_prompt,
)
from rllib_grpo.rewards import DEFAULT_REWARD_TIMEOUT_S, RewardFn, RewardScorer
from rllib_grpo.rewards.pool import DEFAULT_REWARD_WORKERS

DEFAULT_MAX_RESPONSE_CHARS = 65_536
MAX_OBSERVATION_CHARS = 1 << 20
# What Text.sample() draws from; contains() accepts any unicode text.
SAMPLE_CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n−×÷°√π"


class ImageList(gymnasium.spaces.Space):
    """A tuple of RGB PIL images of any size (the images of one prompt)."""

    def __init__(self) -> None:
        super().__init__(shape=None, dtype=None)

    def contains(self, x: Any) -> bool:
        return isinstance(x, tuple) and all(getattr(image, "mode", None) == "RGB" for image in x)

    def sample(self, mask: Any = None, probability: Any = None) -> tuple:
        return ()


class UnicodeText(gymnasium.spaces.Text):
    """A ``Text`` space holding any ``str`` of at most ``max_length`` characters.

    gymnasium's ``Text.contains`` checks each character against a finite charset;
    prompts and responses are arbitrary unicode, so only the type and length are
    checked here. ``sample()`` draws from :data:`SAMPLE_CHARSET`.
    """

    def __init__(self, max_length: int, *, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=0, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length


class TextEnv(gymnasium.Env):
    """Single-turn text environment over a prompt dataset.

    Args:
        dataset: a PromptDataset, a list of dict rows or a file path (see
            :func:`rllib_grpo.envs.datasets.load_prompts`).
        reward_fn: see :func:`rllib_grpo.rewards.resolve_reward_fn`; None
            dispatches on each record's ``data_source``.
        tokenizer: renders chat prompts with its chat template and produces
            ``info["prompt_token_ids"]``; needed for ``max_prompt_length``.
        processor: renders prompts with images (a vision-language model's; module
            docstring); required when any prompt has images.
        max_prompt_length: token limit, enforced with ``truncation`` (verl's
            ``error``/``left``/``right``/``middle``). A truncated prompt's
            observation is the decoded kept tokens.
        filter_overlong_prompts: drop (and count in ``dataset.skipped``) prompts
            over ``max_prompt_length`` at construction instead.
        shuffle, seed: a new permutation per epoch, from ``(seed, epoch)``.
        max_response_chars: the action space length; longer responses keep
            their last ``max_response_chars`` characters (``info["response_clipped"]``).
        reward_timeout_s, format_score, max_answer_chars, reward_kwargs: passed
            to :class:`~rllib_grpo.rewards.RewardScorer`.
        reward_workers, reward_isolation: its ``workers`` (reward calls at once in
            `score_many`; None: the CPUs this process may use) and ``isolation``
            (``auto``: processes for user reward functions, forked on first need and
            killed when they overrun ``reward_timeout_s``; inline or threads for the
            built-in scorers, as each declares).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        dataset: PromptDataset | list[dict] | str,
        *,
        reward_fn: RewardFn | str | None = None,
        tokenizer: Any = None,
        processor: Any = None,
        max_prompt_length: int | None = None,
        truncation: str = "error",
        filter_overlong_prompts: bool = False,
        shuffle: bool = True,
        seed: int | None = None,
        max_response_chars: int = DEFAULT_MAX_RESPONSE_CHARS,
        reward_timeout_s: float | None = DEFAULT_REWARD_TIMEOUT_S,
        format_score: float = 0.0,
        max_answer_chars: int | None = None,
        reward_kwargs: Mapping[str, Any] | None = None,
        reward_workers: int | None = DEFAULT_REWARD_WORKERS,
        reward_isolation: str = "auto",
    ) -> None:
        _check_length_options(tokenizer, max_prompt_length, truncation, filter_overlong_prompts)
        dataset = load_prompts(dataset)
        if dataset.has_images and processor is None:
            raise ValueError(
                f"{dataset.name}: the prompts carry images but the model has no image "
                "processor (a text-only model); use a vision-language model (e.g. "
                "model_path='builtin:demo-vlm' or a Qwen2.5-VL folder) or load the data "
                "without its images column")
        self.tokenizer, self.processor = tokenizer, processor
        if filter_overlong_prompts:
            assert max_prompt_length is not None  # _check_length_options requires it
            dataset = dataset.filter_overlong(tokenizer, max_prompt_length,
                                              self.prompt_lengths(dataset))
        if len(dataset) == 0:
            raise ValueError(f"TextEnv needs at least one prompt.\n{dataset.report()}")
        dataset.log_report()
        if (truncation == "error" or dataset.has_images) and max_prompt_length is not None:
            _check_prompt_lengths(dataset, self.prompt_lengths(dataset), max_prompt_length)
        self.dataset = dataset
        self.max_prompt_length = max_prompt_length
        self.truncation = truncation
        self.shuffle = shuffle
        self.max_response_chars = max_response_chars
        self.scorer = RewardScorer(
            reward_fn,
            timeout_s=reward_timeout_s,
            format_score=format_score,
            max_answer_chars=max_answer_chars,
            reward_kwargs=reward_kwargs,
            workers=reward_workers,
            isolation=reward_isolation,
        )
        self.observation_space: gymnasium.Space = UnicodeText(MAX_OBSERVATION_CHARS)
        if dataset.has_images:
            self.observation_space = gymnasium.spaces.Dict(
                {"text": self.observation_space, "images": ImageList()})
        self.action_space = UnicodeText(max_response_chars)
        entropy = np.random.SeedSequence().entropy
        self._seed = seed if seed is not None else int(entropy) % 2**63  # type: ignore[arg-type]
        self._epoch = 0
        self._position = 0
        self._order = self._permutation(0)
        self._current: PromptRecord | None = None
        self._current_epoch = 0

    @property
    def num_prompts(self) -> int:
        """Number of prompts (after filtering)."""
        return len(self.dataset)

    def prompt_lengths(self, dataset: PromptDataset) -> list[int]:
        """Every prompt's token count as the model sees it (image tokens included)."""
        lengths = prompt_token_lengths([record.prompt for record in dataset], self.tokenizer)
        for i, record in enumerate(dataset):
            if record.images:
                lengths[i] = self.processor.num_prompt_tokens(record.prompt, record.images)
        return lengths

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        """Serve the next prompt, or ``options["index"]`` without advancing the order.

        A ``seed`` restarts the order from epoch 0 under that seed.
        """
        super().reset(seed=seed)
        if seed is not None:
            self._seed, self._epoch, self._position = int(seed), 0, 0
            self._order = self._permutation(0)
        if options and options.get("index") is not None:
            index, epoch = self._checked_index(options["index"]), self._epoch
        else:
            index, epoch = self._advance()
        self._current, self._current_epoch = self.dataset[index], epoch
        observation, token_ids, vision = self._render(self._current)
        info = {
            "index": index,
            "epoch": epoch,
            "data_source": self._current.data_source,
            "ground_truth": self._current.ground_truth,
            "raw_prompt": self._current.prompt,
            "extra_info": self._current.extra_info,
        }
        if token_ids is not None:
            info["prompt_token_ids"] = token_ids
        if self.dataset.has_images:
            info["multi_modal_inputs"] = vision
            return {"text": observation, "images": self._current.images}, info
        return observation, info

    def step(self, action: str) -> tuple[Any, float, bool, bool, dict]:
        """Score the response ``action``; returns ``("", reward, True, False, info)``."""
        record = self._current
        if record is None:
            raise RuntimeError(
                "TextEnv.step() called without a prompt: call reset() first "
                "(each episode is one reset (prompt) and one step (response))"
            )
        response, clipped = self._clip_response(action)
        scorer: Any = self.scorer
        if getattr(scorer, "needs_prompts", False):  # a mixture with reward models
            result = scorer.score_many([(record.data_source, response, record.ground_truth,
                                              record.extra_info)], prompts=[record.prompt])[0]
        else:
            result = self.scorer(record.data_source, response, record.ground_truth,
                                 record.extra_info)
        next_observation = self._next_turn(record, response, result)
        terminated = next_observation is None
        if terminated:
            self._current = None
        info = self._step_info(record, result, self._current_epoch, clipped)
        observation: Any = next_observation or ""
        if self.dataset.has_images:  # the episode's images stay with every turn
            observation = {"text": observation, "images": record.images}
        return observation, float(result["score"]), terminated, False, info

    def score_many(self, responses: list[tuple[int, str]]) -> list[dict]:
        """Score ``(prompt index, response)`` pairs in parallel (the scorer's pool), each
        as one single-turn episode would: the ``info`` `step` returns, with ``score``.
        Does not touch the prompt order or the current episode."""
        records, requests, clipped = [], [], []
        for index, action in responses:
            record = self.dataset[self._checked_index(index)]
            response, was_clipped = self._clip_response(action)
            records.append(record)
            clipped.append(was_clipped)
            requests.append((record.data_source, response, record.ground_truth,
                             record.extra_info))
        scorer: Any = self.scorer
        if getattr(scorer, "needs_prompts", False):  # a mixture with reward models
            results = scorer.score_many(requests, prompts=[r.prompt for r in records])
        else:
            results = self.scorer.score_many(requests)
        return [self._step_info(record, result, self._epoch, was_clipped)
                for record, result, was_clipped in zip(records, results, clipped, strict=True)]

    def _clip_response(self, action: Any) -> tuple[str, bool]:
        if not isinstance(action, str):
            raise TypeError(f"TextEnv actions are response strings, got {type(action).__name__}")
        clipped = len(action) > self.max_response_chars
        return (action[-self.max_response_chars :] if clipped else action), clipped

    @staticmethod
    def _step_info(record: PromptRecord, result: dict, epoch: int, clipped: bool) -> dict:
        return {
            **result,
            "index": record.index,
            "epoch": epoch,
            "data_source": record.data_source,
            "ground_truth": record.ground_truth,
            "response_clipped": clipped,
        }

    def seek(self, position: int) -> None:
        """Serve next the prompt at ``position`` of the epoch-by-epoch order (epoch
        ``position // num_prompts``): several envs with the same seed and data then share
        one order, each serving its own positions."""
        epoch, offset = divmod(int(position), self.num_prompts)
        if epoch != self._epoch:
            self._order = self._permutation(epoch)
        self._epoch, self._position = epoch, offset

    def get_state(self) -> dict:
        """Order position, epoch, seed and reward error counters (for checkpoints)."""
        return {
            "seed": self._seed,
            "epoch": self._epoch,
            "position": self._position,
            "num_prompts": self.num_prompts,
            "scorer": self.scorer.get_state(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue the prompt sequence saved by :meth:`get_state`."""
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"env state is for {state['num_prompts']} prompts but this env has "
                f"{self.num_prompts}: the dataset changed since the checkpoint"
            )
        self._seed, self._epoch, self._position = state["seed"], state["epoch"], state["position"]
        self._order = self._permutation(self._epoch)
        self._current = None
        self.scorer.set_state(state["scorer"])

    def _next_turn(self, record: PromptRecord, response: str, result: dict) -> str | None:
        """The next observation of a multi-turn episode, or None to end it (the default)."""
        return None

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_prompts)
        return np.random.default_rng([self._seed, epoch]).permutation(self.num_prompts)

    def _advance(self) -> tuple[int, int]:
        if self._position >= self.num_prompts:
            self._epoch, self._position = self._epoch + 1, 0
            self._order = self._permutation(self._epoch)
        index = int(self._order[self._position])
        self._position += 1
        return index, self._epoch

    def _checked_index(self, index: Any) -> int:
        if not 0 <= int(index) < self.num_prompts:
            raise IndexError(f"options['index']={index} is outside 0..{self.num_prompts - 1}")
        return int(index)

    def _render(self, record: PromptRecord) -> tuple[str, list[int] | None, Any]:
        """Observation text, token ids and (prompts with images) vision inputs."""
        if record.images:
            # Lengths were checked at construction: image prompts are never truncated.
            return self.processor.encode(record.prompt, record.images)
        if self.tokenizer is None:
            return render_prompt(record.prompt), None, None
        text, token_ids = render_and_encode(record.prompt, self.tokenizer)
        kept = apply_length_limit(token_ids, self.max_prompt_length, self.truncation)
        if len(kept) < len(token_ids):
            text = self.tokenizer.decode(kept)
        return text, kept, None


def env_options(env_cls: type) -> tuple[set[str], bool]:
    """The keyword options ``env_cls(...)`` takes, following ``**kwargs`` up the classes
    it forwards them to (a TextEnv subclass hands them to `TextEnv`), and whether it takes
    any keyword at all (a ``**kwargs`` that reaches no known class)."""
    names: set[str] = set()
    for cls in env_cls.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        parameters = inspect.signature(init).parameters.values()
        names |= {p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                  and p.name != "self"}
        if not any(p.kind == p.VAR_KEYWORD for p in parameters):
            return names, False
        if cls is TextEnv:
            break
    return names, not issubclass(env_cls, TextEnv)


def _check_prompt_lengths(dataset: PromptDataset, lengths: list[int],
                          max_prompt_length: int) -> None:
    """``truncation="error"`` (and any prompt with images, whose image tokens cannot be
    cut): refuse an over-long prompt when the data loads, not when it is first drawn
    mid-training."""
    overlong = [(record, n) for record, n in zip(dataset, lengths, strict=True)
                if n > max_prompt_length]
    if overlong:
        (record, length), more = overlong[0], len(overlong) - 1
        raise ValueError(
            f"{record.where()}: prompt is {length} tokens, longer than max_prompt_length="
            f"{max_prompt_length}{f' (and {more} more prompts)' if more else ''}; raise "
            "max_prompt_length, set truncation to 'left', 'right' or 'middle', or set "
            "filter_overlong_prompts=True")


def _check_length_options(
    tokenizer: Any, max_prompt_length: int | None, truncation: str, filter_overlong: bool
) -> None:
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"truncation must be one of {TRUNCATION_MODES}, got {truncation!r}")
    if max_prompt_length is not None and tokenizer is None:
        raise ValueError("max_prompt_length counts tokens: pass tokenizer=... as well")
    if filter_overlong and max_prompt_length is None:
        raise ValueError("filter_overlong_prompts=True needs max_prompt_length (and a tokenizer)")
