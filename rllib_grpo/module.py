"""A transformers causal LM as an RLlib `TorchRLModule`.

The module holds the policy (`lm`) and, when a KL term is on, a frozen
reference copy (`ref_lm`, never trained, never synced, not part of the state).
Its forward returns the response tokens' log-probs at the sampling temperature
(and their entropy), which is all the GRPO loss needs.
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.rl_module.apis import InferenceOnlyAPI
from ray.rllib.core.rl_module.torch import TorchRLModule

from rllib_grpo.algos import entropy_from_logits, logprobs_from_logits
from rllib_grpo.models import load_causal_lm, resolve_model


def response_log_probs(
    lm: torch.nn.Module,
    batch: dict[str, torch.Tensor],
    temperature: float,
    with_entropy: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probs (and entropy) of the response tokens under ``lm`` at ``temperature``.

    Args:
        batch: ``prompt_ids``/``prompt_mask`` (B, P), left-padded, and
            ``response_ids``/``response_mask`` (B, R), right-padded.

    Returns:
        ``{"log_probs": (B, R), "entropy": (B, R) if with_entropy}``; padding
        positions hold values that the caller masks out.
    """
    prompt_len = batch["prompt_ids"].shape[1]
    input_ids = torch.cat([batch["prompt_ids"], batch["response_ids"]], dim=1).long()
    attention_mask = torch.cat([batch["prompt_mask"], batch["response_mask"]], dim=1).long()
    # Left padding shifts the real tokens, so positions must come from the mask.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    logits = lm(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
        use_cache=False,
    ).logits
    # Logits at position t predict token t+1: the response is predicted from P-1 .. P+R-2.
    response_logits = logits[:, prompt_len - 1 : -1].float() / temperature
    out = {"log_probs": logprobs_from_logits(response_logits, batch["response_ids"].long())}
    if with_entropy:
        out["entropy"] = entropy_from_logits(response_logits)
    return out


class CausalLMRLModule(TorchRLModule, InferenceOnlyAPI):
    """RLModule around a Hugging Face causal LM (policy + optional frozen reference).

    ``model_config`` keys: ``model`` (path / id / builtin name), ``dtype``,
    ``gradient_checkpointing``, ``temperature``, ``use_reference``.
    """

    def setup(self) -> None:
        cfg = self.model_config
        path = resolve_model(cfg["model"])
        self.temperature = float(cfg.get("temperature", 1.0))
        self.lm = load_causal_lm(
            path, dtype=cfg.get("dtype", "float32"),
            gradient_checkpointing=cfg.get("gradient_checkpointing", False),
        )
        self.ref_lm = None
        if cfg.get("use_reference") and not self.inference_only:
            self.ref_lm = load_causal_lm(path, dtype=cfg.get("dtype", "float32"))
            self.ref_lm.requires_grad_(False)
            self.ref_lm.eval()

    def get_non_inference_attributes(self) -> list[str]:
        return ["ref_lm"]

    def _forward_train(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        return response_log_probs(
            self.lm, batch, self.temperature, with_entropy=kwargs.get("with_entropy", True)
        )

    def _forward(self, batch: dict[str, Any], **kwargs: Any) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            return response_log_probs(self.lm, batch, self.temperature, with_entropy=True)

    @torch.no_grad()
    def reference_log_probs(self, batch: dict[str, Any]) -> torch.Tensor:
        """Response log-probs under the frozen reference model, (B, R)."""
        if self.ref_lm is None:
            raise RuntimeError("No reference model: set use_kl_loss or use_kl_in_reward.")
        return response_log_probs(self.ref_lm, batch, self.temperature)["log_probs"]

    # bf16-safe state: RLlib's default converts to numpy, which has no bfloat16.
    def get_state(self, components=None, *, not_components=None, inference_only=False, **kw):
        return {k: v.detach().cpu().clone() for k, v in self.lm.state_dict().items()}

    def set_state(self, state: dict[str, torch.Tensor]) -> None:
        self.lm.load_state_dict(
            {k: torch.as_tensor(v) for k, v in state.items()}, strict=True
        )
