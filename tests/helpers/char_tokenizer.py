"""A character-level tokenizer for data tests that need no model."""

from __future__ import annotations


class CharTokenizer:
    """One token per character (its code point); ``chat=True`` adds a chat template."""

    def __init__(self, chat: bool = False):
        self.chat_template = "<role>content" if chat else None

    def encode(self, text, add_special_tokens=False):
        return [ord(char) for char in text]

    def decode(self, token_ids):
        return "".join(map(chr, token_ids))

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        body = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")
