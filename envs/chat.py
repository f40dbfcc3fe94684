"""Render a conversation turn by turn into the token ids the model sees.

A multi-turn trajectory is one token sequence: the prompt (rendered by the env
as for single-turn episodes), then alternately the model's sampled tokens,
kept exactly as sampled, and the environment's tokens. This module makes the
environment's tokens: what closes the model's turn, the environment's
messages and the opening of the next model turn.

* **Chat template** (the tokenizer has one): the environment's tokens are the
  difference between ``apply_chat_template`` of a reference conversation with
  and without the new messages (``add_generation_prompt=True``), i.e. exactly
  what the template writes between two assistant turns, minus the end-of-turn
  token when the model sampled it itself. A template that refuses the
  ``tool`` role (strict user/assistant alternation) gets tool results as
  ``user`` messages.
* **Plain format** (no template, e.g. the character-level built-in models):
  each message's content is appended as it is, right after the model's last
  token (its EOS when it stopped), with no role markers and no separators;
  environments for plain models write self-delimiting replies
  (``<result>27</result>``, ``higher\\n``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Distinctive contents of the reference conversation (never produced by a template).
_USER, _ASSISTANT = "\u2063user-probe\u2063", "\u2063assistant-probe\u2063"


class ConversationRenderer:
    """Token ids of the environment's side of a conversation, for one tokenizer."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.uses_template = bool(getattr(tokenizer, "chat_template", None))
        self._turn_close = self._assistant_turn_close() if self.uses_template else ""

    def continuation_ids(self, response_ids: Sequence[int], stopped: bool,
                         messages: Sequence[dict]) -> list[int]:
        """Tokens after a model turn: close the turn, the env's ``messages``, open the next turn.

        Args:
            response_ids: the model's sampled tokens of this turn.
            stopped: True when the turn ended with a stop token (EOS or a stop id),
                False when it was cut by a token limit.
            messages: ``[{"role": "tool"|"user", "content": str}, ...]``.
        """
        return self._encode(self.continuation_text(response_ids, stopped, messages))

    def continuation_text(self, response_ids: Sequence[int], stopped: bool,
                          messages: Sequence[dict]) -> str:
        """The text :meth:`continuation_ids` encodes."""
        if not self.uses_template:
            return "".join(str(m["content"]) for m in messages)
        close = self._turn_close
        if stopped and response_ids:
            # The model sampled the end of its turn (e.g. <|im_end|>): write only the rest.
            last = self.tokenizer.decode([response_ids[-1]])
            if last and close.startswith(last):
                close = close[len(last):]
        return close + self._messages_text(messages)

    # ------------------------------------------------------------------ template probing
    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt)

    def _reference(self) -> list[dict]:
        return [{"role": "user", "content": _USER}, {"role": "assistant", "content": _ASSISTANT}]

    def _assistant_turn_close(self) -> str:
        """What the template writes right after an assistant message's content."""
        text = self._render(self._reference(), False)
        position = text.rfind(_ASSISTANT)
        if position < 0:
            raise ValueError("the chat template drops assistant messages; multi-turn episodes "
                             "need a template that renders the conversation history")
        return text[position + len(_ASSISTANT):]

    def _messages_text(self, messages: Sequence[dict]) -> str:
        """Template text of ``messages`` after an assistant turn, with the next generation prompt."""
        reference = self._reference()
        before = self._render(reference, False)
        for attempt in (list(messages), [_as_user(m) for m in messages]):
            try:
                after = self._render(reference + attempt, True)
            except Exception:  # templates raise on roles they do not know (jinja errors)
                continue
            if after.startswith(before):
                return after[len(before):]
        raise ValueError(
            "the chat template does not render environment messages after an assistant turn "
            "as a continuation of the history (it rewrites earlier turns); use a template "
            "that keeps the history or a tokenizer without one (plain format)")

    def _encode(self, text: str) -> list[int]:
        if not text:
            return []
        try:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        except TypeError:  # tokenizers without that keyword
            return list(self.tokenizer.encode(text))


def _as_user(message: dict) -> dict:
    return {"role": "user", "content": message["content"]} if message["role"] != "assistant" \
        else message


def conversation_text(turns: Sequence[tuple[str, str]], limit: int = 4000) -> str:
    """A readable transcript ``role: text`` per line (TensorBoard completions), cut at ``limit``."""
    text = "\n".join(f"{role}: {content}" for role, content in turns)
    return text if len(text) <= limit else text[:limit] + " ..."
