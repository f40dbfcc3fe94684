"""LLM judges (generative reward models): a prompt template and a rule that reads a score.

A judge is a causal LM asked, through ``template``, to grade a response.  The template is
``str.format`` text with the placeholders ``{prompt}`` and ``{response}`` (both required)
and optionally ``{ground_truth}``; `template_error` refuses anything else before a run
starts.  Two parse rules (`JudgeRule`):

* ``"range"``: the judge writes a number; the first number of its text, in
  ``[low, high]``, is mapped linearly to [0, 1].  No number, or one outside the range, is
  an error (the sample scores 0 and is counted, like a reward function that raises).
* ``"yes"``: the probability that the judge's next token is "yes", normalised over
  "yes" and "no": ``P(yes) / (P(yes) + P(no))`` summed over the spellings of each
  (``yes``, ``Yes``, `` yes``, ...).  Read from one forward pass's next-token distribution.

Where a local judge generates: `rllib_grpo.rllib.algorithm.reward_workers` (vLLM where
present, the transformers sampler otherwise).  An OpenAI-compatible endpoint:
`rllib_grpo.rewards.remote.OpenAIJudge`.  No Ray, no torch at import.
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rllib_grpo.rewards._numbers import first_number

REQUIRED_FIELDS = ("prompt", "response")
OPTIONAL_FIELDS = ("ground_truth",)
JUDGE_RULES = ("range", "yes")
YES_SPELLINGS = ("yes", "Yes", "YES", " yes", " Yes", " YES")
NO_SPELLINGS = ("no", "No", "NO", " no", " No", " NO")
DEFAULT_TEMPLATE = (
    "Rate the response to the question on a scale from 0 to 10; answer with the number "
    "only.\nQuestion: {prompt}\nResponse: {response}\nRating:")


def template_error(template: Any) -> str | None:
    """Why ``template`` is no judge template, or None: it must be a ``str.format`` text
    holding ``{prompt}`` and ``{response}``, and no other field but ``{ground_truth}``."""
    if not isinstance(template, str):
        return f"judge template must be a string, got {type(template).__name__}"
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as err:
        return f"judge template does not parse as str.format text ({err})"
    missing = [f"{{{f}}}" for f in REQUIRED_FIELDS if f not in fields]
    unknown = sorted(fields - set(REQUIRED_FIELDS) - set(OPTIONAL_FIELDS))
    if missing:
        return (f"judge template lacks {' and '.join(missing)}: the judge would not see what "
                "it grades")
    if unknown:
        return (f"judge template has unknown placeholders {unknown}: use {{prompt}}, "
                "{response} and {ground_truth} (double a literal brace: {{ }})")
    return None


def fill_template(template: str, prompt: Any, response: str, ground_truth: Any = None) -> str:
    """The judge's request: ``template`` with the prompt (messages joined by newlines), the
    response and the ground truth filled in."""
    text = prompt if isinstance(prompt, str) else "\n".join(m["content"] for m in prompt)
    return template.format(prompt=text, response=response,
                           ground_truth="" if ground_truth is None else ground_truth)


@dataclass(frozen=True)
class JudgeRule:
    """How a judge's output becomes a score in [0, 1] (module docstring)."""

    kind: str = "range"
    low: float = 0.0
    high: float = 10.0

    def error(self) -> str | None:
        """Why this rule is unusable, or None."""
        if self.kind not in JUDGE_RULES:
            return f"judge parse rule {self.kind!r}: use one of {', '.join(JUDGE_RULES)}"
        if self.kind == "range" and not self.high > self.low:
            return f"judge range [{self.low}, {self.high}] must have high > low"
        return None

    def parse(self, text: str) -> float:
        """The ``range`` rule on generated ``text``; ValueError when it holds no number in
        the range."""
        number = first_number(text)
        if number is None:
            raise ValueError(f"the judge wrote no number: {text[:80]!r}")
        value = float(number)
        if not self.low <= value <= self.high:
            raise ValueError(f"the judge's {value:g} is outside [{self.low:g}, {self.high:g}]")
        return (value - self.low) / (self.high - self.low)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> JudgeRule:
        """From a judge spec: ``parse`` (``"range"`` or ``"yes"``) and ``range: [low, high]``."""
        low, high = options.get("range", (0.0, 10.0))
        return cls(str(options.get("parse", "range")), float(low), float(high))


def yes_no_token_ids(tokenizer: Any) -> tuple[list[int], list[int]]:
    """Token ids of the one-token spellings of "yes" and of "no" in ``tokenizer``."""
    def ids(spellings: Sequence[str]) -> list[int]:
        found = set()
        for word in spellings:
            encoded = tokenizer.encode(word, add_special_tokens=False)
            if len(encoded) == 1:
                found.add(int(encoded[0]))
        return sorted(found)

    yes, no = ids(YES_SPELLINGS), ids(NO_SPELLINGS)
    if not yes or not no:
        raise ValueError("the judge's tokenizer has no one-token 'yes' or 'no': use the "
                         "'range' parse rule")
    return yes, no


def yes_probability(next_token_logits: Any, yes_ids: Sequence[int], no_ids: Sequence[int]
                    ) -> list[float]:
    """``P(yes) / (P(yes) + P(no))`` per row of next-token logits (a torch tensor
    ``[batch, vocab]``), computed in float64."""
    import torch

    log_probs = torch.log_softmax(next_token_logits.double(), dim=-1)
    yes = torch.logsumexp(log_probs[:, list(yes_ids)], dim=-1)
    no = torch.logsumexp(log_probs[:, list(no_ids)], dim=-1)
    return torch.sigmoid(yes - no).tolist()  # e^y / (e^y + e^n)


def judge_messages(template: str, prompt: Any, response: str, ground_truth: Any = None
                   ) -> list[dict[str, str]]:
    """The judge's conversation: one user turn holding the filled template."""
    return [{"role": "user", "content": fill_template(template, prompt, response, ground_truth)}]


def render_judge_prompt(tokenizer: Any, template: str, prompt: Any, response: str,
                        ground_truth: Any = None) -> str:
    """The judge's input text: its chat template (with the generation prompt) over
    `judge_messages`, or the filled template itself without a chat template."""
    messages = judge_messages(template, prompt, response, ground_truth)
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return messages[0]["content"]
