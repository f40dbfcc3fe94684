"""Tokenizers: the character-level tokenizer of the built-in models, and `load_tokenizer`.

Tokenizer trap (transformers 5): ``AutoTokenizer.from_pretrained(folder)``
ignores the saved ``tokenizer_class`` for some model types (``qwen2`` among
them) and rebuilds a byte-level BPE tokenizer from the vocabulary, which
splits a character alphabet differently.  The built-in model therefore uses
the ``llama`` model type, whose folder ``AutoTokenizer`` loads as saved;
``load_tokenizer`` trusts a saved ``tokenizer.json`` for every model type.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Sequence
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

logger = logging.getLogger(__name__)



PAD, EOS, UNK, BOS = "<pad>", "<eos>", "<unk>", "<bos>"
SPECIAL_TOKENS = (PAD, EOS, UNK, BOS)
DEFAULT_ALPHABET = "0123456789+-*="


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, *, model_max_length: int | None = None,
    added_tokens: Sequence[str] = (),
) -> PreTrainedTokenizerFast:

    """A character-level tokenizer: one token per character of ``alphabet``.

    Ids 0-3 are ``<pad>``, ``<eos>``, ``<unk>``, ``<bos>``; the alphabet follows
    in order (duplicates dropped).  Characters outside the alphabet map to
    ``<unk>``.  Nothing is added around an encoded text (no BOS, no EOS) and
    there is no chat template, so ``"3+4="`` encodes to exactly four ids.
    ``added_tokens`` (e.g. ``"<tool>"``) are whole tokens after the alphabet,
    matched before the split into characters and kept when decoding with
    ``skip_special_tokens=True`` (they are not special), as a real tokenizer's
    ``<tool_call>`` is.
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Oniguruma's (?m) makes "." match newlines too: every character is a piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters without spaces
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    if added_tokens:
        backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in added_tokens])
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=BOS,
        **extra,
    )


def _special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    ids = {
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    return {key: value for key, value in ids.items() if value is not None}


def _name_generic_tokenizer_class(path: str) -> None:
    """Name the tokenizer class the way every transformers version knows it."""
    config_file = Path(path, "tokenizer_config.json")
    config = json.loads(config_file.read_text())
    if config.get("tokenizer_class") == "TokenizersBackend":  # transformers 5's alias
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _warn_if_auto_tokenizer_differs(tokenizer: PreTrainedTokenizerBase, path: str) -> None:
    reloaded = AutoTokenizer.from_pretrained(path)
    probe = "".join(list(tokenizer.get_vocab())[:64]) + " 12+3=\n"
    if len(reloaded) != len(tokenizer) or reloaded.encode(probe) != tokenizer.encode(probe):
        logger.warning(
            "AutoTokenizer.from_pretrained(%r) returns a %s that differs from the saved "
            "tokenizer; use rllib_grpo.models.load_tokenizer, or the llama model type",
            path,
            type(reloaded).__name__,
        )


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """Load a tokenizer, trusting a saved generic ``tokenizer.json`` over the model type.

    Sets ``pad_token`` to ``eos_token`` when the tokenizer has none, so that
    batches can be padded.  A process loads a folder's tokenizer once: later calls for
    the same folder, its files unchanged, return the same object (the config check, the
    env runner and the transformers sampler each ask for it, and a large vocabulary takes
    a noticeable time to load), so treat it as read-only.  A hub id is loaded on every call.
    """
    key = _folder_stamp(path)
    with _LOADED_LOCK:
        tokenizer = _LOADED.get(key) if key else None
        if tokenizer is None:
            tokenizer = _load_tokenizer(path)
            if key:
                _LOADED[key] = tokenizer
    return tokenizer


# (folder, its non-weight files' names, sizes and modification times) -> the loaded tokenizer.
_LOADED: dict[tuple, PreTrainedTokenizerBase] = {}
_LOADED_LOCK = threading.Lock()
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


def _folder_stamp(path: str) -> tuple | None:
    """What identifies a saved tokenizer's files on disk; None for anything but a folder."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    files = []
    for file in sorted(folder.iterdir()):
        if file.is_file() and not file.name.endswith(_WEIGHT_SUFFIXES):
            stat = file.stat()
            files.append((file.name, stat.st_size, stat.st_mtime_ns))
    return (str(folder.resolve()), tuple(files))


def _load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    if _saved_as_generic_fast_tokenizer(path):
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
    else:
        tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _saved_as_generic_fast_tokenizer(path: str) -> bool:
    config_file = Path(path, "tokenizer_config.json")
    if not (config_file.is_file() and Path(path, "tokenizer.json").is_file()):
        return False
    tokenizer_class = json.loads(config_file.read_text()).get("tokenizer_class")
    return tokenizer_class in ("PreTrainedTokenizerFast", "TokenizersBackend")


