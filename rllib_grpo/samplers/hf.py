"""A sampler on transformers' ``generate``: the fallback where vLLM does not import.

A vision-language model (the Qwen2-VL family) samples with the images in its forward: the
prompts' token ids come with every image's tokens expanded, and the sampler turns each
prompt's images into pixel values with the model's image processor
(`rllib_grpo.models.vision.ImagePromptProcessor`, the env's own).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from rllib_grpo.models.attention import prefer_matmul_attention
from rllib_grpo.models.loading import load_causal_lm
from rllib_grpo.models.tokenizers import load_tokenizer
from rllib_grpo.models.vision import (
    ImagePromptProcessor,
    placeholder_token_ids,
    vision_model_type,
)
from rllib_grpo.models.vision_forward import stacked_vision_inputs
from rllib_grpo.samplers.base import (
    CallSeeds,
    Sample,
    SamplingParams,
    combined_seed,
    cut_before,
    runner_device,
    state_dict_bytes,
)
from rllib_grpo.samplers.hf_weights import HFWeightTransfer

logger = logging.getLogger(__name__)


class HFSampler(HFWeightTransfer):
    """Samples with its own copy of a transformers causal LM.

    All prompts x ``n`` samples go through one left-padded ``generate`` call
    (or chunks of ``max_batch_size`` rows).  Log-probs come from the processed
    scores (temperature, top-k, top-p applied), i.e. the sampling distribution,
    gathered at the drawn token step by step (`ChosenTokenLogProbs`).  ``device=None``
    is the GPU this process holds, else the CPU (`rllib_grpo.samplers.base.runner_device`).
    Weights arrive through vLLM's weight-transfer API (`HFWeightTransfer`).
    """

    def __init__(
        self,
        model_path: str,
        *,
        tokenizer_path: str | None = None,
        dtype: str = "float32",
        seed: int = 0,
        device: str | torch.device | None = None,
        max_batch_size: int | None = None,
        config_overrides: dict | None = None,
    ) -> None:
        self.device = torch.device(device) if device is not None else runner_device()
        self.model = load_causal_lm(model_path, dtype=dtype,
                                    config_overrides=config_overrides).to(self.device)
        prefer_matmul_attention(self.model, self.device, dtype)  # CPU at 16 bits: faster
        self.eos_token_ids = _eos_token_ids(self.model, tokenizer_path or model_path)
        if not self.eos_token_ids:
            logger.warning("no eos token found for %s: samples end only at max_tokens", model_path)
        pad_id = self.model.generation_config.pad_token_id
        self.pad_token_id = pad_id if pad_id is not None else min(self.eos_token_ids, default=0)
        # generate() fills every unset option from model.generation_config (a hub
        # model's repetition_penalty, top_k, ...): keep only the token ids there.
        self.model.generation_config = GenerationConfig(
            eos_token_id=sorted(self.eos_token_ids), pad_token_id=self.pad_token_id
        )
        self.seeds = CallSeeds(seed)
        self.max_batch_size = max_batch_size
        self.processor = (ImagePromptProcessor.from_pretrained(tokenizer_path or model_path)
                          if vision_model_type(model_path) else None)
        self.placeholder_ids = placeholder_token_ids(model_path)  # never in a response
        self._init_weight_transfer()

    def generate(
        self, prompts: Sequence[Sequence[int]], n: int, params: SamplingParams,
        *, seeds: Sequence[int] | None = None, images: Sequence[Sequence[Any]] | None = None,
    ) -> list[list[Sample]]:
        """``n`` samples per prompt; reproducible for a given ``params.seed``.

        ``seeds`` (one per prompt): one batched ``generate`` has one RNG, so the call
        is seeded from all of them (`rllib_grpo.samplers.base.combined_seed`).
        ``images`` (one sequence per prompt, a vision-language model's): each prompt's
        images, whose expanded tokens its ids hold.
        """
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        rows = [list(prompt) for prompt in prompts for _ in range(n)]
        visions: list[Any] = [None] * len(rows)
        if images is not None and any(images):
            if self.processor is None:
                raise ValueError("prompts with images need a vision-language model; this "
                                 "sampler's model is text-only")
            per_prompt = [self.processor.vision_inputs(i) if i else None for i in images]
            visions = [v for v in per_prompt for _ in range(n)]
        stop_ids = self.eos_token_ids | set(params.stop_token_ids or ())
        chunk = self.max_batch_size or max(len(rows), 1)
        samples: list[Sample] = []
        call_seed = combined_seed(seeds) if seeds is not None else self.seeds.next(params)
        with _seeded_rng(call_seed, self.device):
            for start in range(0, len(rows), chunk):
                samples += self._generate_rows(rows[start : start + chunk], params, stop_ids,
                                               visions[start : start + chunk])
        if self.placeholder_ids:
            samples = [cut_before(sample, self.placeholder_ids) for sample in samples]
        return [samples[i * n : (i + 1) * n] for i in range(len(prompts))]

    def load_weights(
        self, state_dict: Mapping[str, torch.Tensor], *, partial: bool = False
    ) -> dict[str, float]:
        """Copy a full HF-named state dict into the model; a tied ``lm_head.weight`` may be left out.

        ``partial=True`` (the LoRA sync's merged layers) copies a subset and keeps the rest.
        """
        start = time.perf_counter()
        self._check_names(set(state_dict), partial)
        self._copy_into_model(state_dict.items())
        return {"bytes": state_dict_bytes(state_dict), "seconds": time.perf_counter() - start}

    def sleep(self, level: int = 1) -> None:
        """No-op: the transformers sampler keeps its weights where they are."""

    def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """No-op (see ``sleep``)."""

    def close(self) -> None:
        """Drop the model."""
        self._weight_receiver.close()
        self.model, self._live = None, None

    # ------------------------------------------------------------------ internals

    def _generation_config(self, params: SamplingParams, stop_ids: set[int]) -> GenerationConfig:
        """Sampling or greedy, with no warper of transformers' own: `_warpers` applies
        temperature, top-k and top-p before the log-probs are taken."""
        sampling = params.temperature > 0
        # Greedy: no sampling option at all (transformers warns about any that is set).
        return GenerationConfig(
            do_sample=sampling,
            temperature=1.0 if sampling else None,
            top_p=1.0 if sampling else None,
            top_k=0 if sampling else None,  # 0: off (transformers' default is 50)
            max_new_tokens=params.max_tokens,
            eos_token_id=sorted(stop_ids),
            pad_token_id=self.pad_token_id,
        )

    @torch.no_grad()
    def _generate_rows(
        self, rows: list[list[int]], params: SamplingParams, stop_ids: set[int],
        visions: Sequence[Any],
    ) -> list[Sample]:
        input_ids, attention_mask = _left_padded(rows, self.pad_token_id, self.device)
        log_probs = ChosenTokenLogProbs()
        vision_kwargs: dict[str, Any] = {}
        if any(v is not None for v in visions):  # the images and where their tokens are
            assert self.processor is not None
            vision_kwargs = stacked_vision_inputs(visions, self.device, self.model.dtype)
            vision_kwargs["mm_token_type_ids"] = (
                input_ids == self.processor.image_token_id).int()
        sequences = self.model.generate(
            input_ids=input_ids, attention_mask=attention_mask,
            generation_config=self._generation_config(params, stop_ids),
            logits_processor=LogitsProcessorList([*_warpers(params), log_probs]),
            **vision_kwargs,
        )
        new_token_ids = sequences[:, input_ids.shape[1] :]
        new_token_log_probs = log_probs.finish(sequences[:, -1])[:, : new_token_ids.shape[1]]
        return [
            _trimmed_sample(ids, lps, stop_ids)
            for ids, lps in zip(new_token_ids.tolist(), new_token_log_probs.tolist(), strict=True)
        ]


class ChosenTokenLogProbs(LogitsProcessor):
    """The last logits processor of a ``generate`` call: the processed log-prob of each
    drawn token, without keeping any step's full-vocabulary scores.

    A step's scores are held until the next step shows the token drawn from them (the last
    column of ``input_ids``), then reduced to that token's ``log_softmax``: one
    rows x vocab tensor at a time instead of ``output_scores``' rows x steps x vocab.
    """

    def __init__(self) -> None:
        self.pending: torch.Tensor | None = None  # the last step's processed scores
        self.per_step: list[torch.Tensor] = []  # [rows] log-probs, one per finished step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor
                 ) -> torch.FloatTensor:
        if self.pending is not None:
            self._gather(input_ids[:, -1])
        self.pending = scores
        return scores

    def finish(self, last_token_ids: torch.Tensor) -> torch.Tensor:
        """[rows, steps] log-probs, the last step's taken at ``last_token_ids``.  (A
        decoding step transformers undoes at the end adds one trailing column.)"""
        if self.pending is not None:
            self._gather(last_token_ids)
        if not self.per_step:
            return torch.zeros(len(last_token_ids), 0)
        return torch.stack(self.per_step, dim=1)

    def _gather(self, token_ids: torch.Tensor) -> None:
        assert self.pending is not None
        log_probs = self.pending.float().log_softmax(-1)
        self.per_step.append(log_probs.gather(-1, token_ids[:, None])[:, 0])
        self.pending = None


def _warpers(params: SamplingParams) -> list[LogitsProcessor]:
    """Temperature, top-k and top-p: transformers' own warpers in its own order, so that
    `ChosenTokenLogProbs` after them sees the sampling distribution."""
    if params.temperature <= 0:
        return []
    warpers: list[LogitsProcessor] = []
    if params.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(params.temperature))
    if params.top_k > 0:
        warpers.append(TopKLogitsWarper(top_k=params.top_k, min_tokens_to_keep=1))
    if params.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=params.top_p, min_tokens_to_keep=1))
    return warpers


def _eos_token_ids(model: Any, tokenizer_path: str) -> set[int]:
    """EOS ids from the generation config, the model config and the tokenizer, as vLLM unites them."""
    ids: set[int] = set()
    for source in (model.generation_config.eos_token_id,
                   model.config.get_text_config().eos_token_id):
        ids |= {source} if isinstance(source, int) else set(source or ())
    with contextlib.suppress(OSError, ValueError):  # a weights-only folder has no tokenizer
        eos_id = load_tokenizer(tokenizer_path).eos_token_id
        if eos_id is not None:
            ids.add(eos_id)
    return ids


def _left_padded(
    rows: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            input_ids[i, width - len(row) :] = torch.tensor(row)
            attention_mask[i, width - len(row) :] = 1
    return input_ids.to(device), attention_mask.to(device)


def _trimmed_sample(ids: list[int], log_probs: list[float], stop_ids: set[int]) -> Sample:
    """Cut after the first stop token (kept); what follows is padding."""
    for i, token_id in enumerate(ids):
        if token_id in stop_ids:
            return Sample(ids[: i + 1], log_probs[: i + 1], "stop")
    return Sample(ids, log_probs, "length")


@contextlib.contextmanager
def _seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's RNG for one call and restore the caller's RNG state afterwards."""
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
