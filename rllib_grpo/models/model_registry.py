"""Built-in models by name: `register_builtin_model`, `resolve_model` and the on-disk cache.

Everything here works offline: a built-in model is built in code once and
cached on disk so that transformers, vLLM and every Ray worker load the same
folder.  The modules that register the built-ins (`BUILTIN_MODULES`) are
imported on first use, by name, so no module of this package has to be
imported for its side effect.  No Ray in this module.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rllib_grpo.models.loading import BuiltinBuilder, save_model_dir

# Modules whose import registers built-in models; imported by name on first use.
BUILTIN_MODULES = ("rllib_grpo.models.builtins", "rllib_grpo.models.demo_model",
                   "rllib_grpo.models.demo_agents", "rllib_grpo.models.reward_models",
                   "rllib_grpo.models.demo_vlm")

_BUILTINS: dict[str, tuple[BuiltinBuilder, dict[str, Any]]] = {}
_loaded_builtin_modules = False


def _load_builtin_modules() -> None:
    global _loaded_builtin_modules
    if not _loaded_builtin_modules:
        _loaded_builtin_modules = True
        for module in BUILTIN_MODULES:
            importlib.import_module(module)


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
    _load_builtin_modules()
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
    - an existing local folder: returned as is (``~`` expanded);
    - anything else: returned as is, taken for a Hugging Face hub id.
    """
    _load_builtin_modules()
    if name_or_path.startswith("~"):  # a shell would have expanded it: not a hub id
        name_or_path = os.path.expanduser(name_or_path)
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


def needs_build(name_or_path: str, *, cache_dir: str | os.PathLike | None = None) -> bool:
    """Whether ``resolve_model(name_or_path)`` would build a built-in model now (it is a
    registered name whose folder is not in the cache yet)."""
    _load_builtin_modules()
    if name_or_path not in _BUILTINS:
        return False
    folder = Path(cache_dir or default_cache_dir()) / _cache_key(
        name_or_path, _BUILTINS[name_or_path][1])
    return not folder.is_dir()


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


# What a saved model folder must hold besides config.json (any one pattern of each).
WEIGHT_FILES = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.pt")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def model_path_error(name_or_path: str, *, allow_hub_download: bool = False) -> str | None:
    """Why ``name_or_path`` will not load as a model, or None.  Checked before anything
    starts: a built-in name, a folder holding a saved model (``config.json``), a Hugging
    Face hub id already in the local cache, or any hub id with ``allow_hub_download``.  A
    folder must hold config.json, weights and a tokenizer (`WEIGHT_FILES`, `TOKENIZER_FILES`)."""
    if not isinstance(name_or_path, str) or not name_or_path:
        return f"model_path={name_or_path!r} must be a folder, a built-in name or a hub id"
    if name_or_path in builtin_model_names():
        return None
    folder = Path(name_or_path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            return (f"model_path={name_or_path!r} is a folder without config.json: not a "
                    "saved Hugging Face model (save_pretrained writes one)")
        missing = [f"no {what} ({', '.join(patterns)})" for what, patterns in (
            ("weights", WEIGHT_FILES), ("tokenizer", TOKENIZER_FILES))
                   if not any(any(folder.glob(p)) for p in patterns)]
        if missing:
            return (f"model_path={name_or_path!r} has config.json but {' and '.join(missing)}: "
                    "save both the model and its tokenizer with save_pretrained")
        return None
    builtins = ", ".join(builtin_model_names())
    if not HUB_ID.fullmatch(name_or_path) or name_or_path.startswith((".", "~", "/")):
        return (f"model_path={name_or_path!r}: no such folder, and not a built-in model "
                f"({builtins}) nor a Hugging Face hub id")
    if allow_hub_download or _in_hub_cache(name_or_path):
        return None
    return (f"model_path={name_or_path!r} is no local folder nor a built-in model ({builtins}); "
            "as a Hugging Face hub id it is not in the local cache: download it first "
            f"(huggingface-cli download {name_or_path}), or set allow_hub_download=True so "
            "that every worker downloads it")


def _in_hub_cache(repo_id: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)


def _cache_key(name: str, params: Mapping[str, Any]) -> str:
    blob = json.dumps({"name": name, "params": params}, sort_keys=True, default=repr)
    short_name = name.split(":")[-1].replace("/", "_")
    return f"{short_name}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def _build_atomically(builder_fn: BuiltinBuilder, params: dict[str, Any], folder: Path) -> None:
    """Build into a scratch folder, then rename: concurrent workers never see half a model."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent)
    try:
        model, tokenizer, *image_processor = builder_fn(**params)
        save_model_dir(model, tokenizer, scratch, *image_processor)
        os.rename(scratch, folder)
    except OSError:
        if not folder.is_dir():  # a lost race leaves the winner's folder: fine
            raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)



# Model families by a part of their name, for a hub id whose config.json is not at hand.
_FAMILIES = (("qwen2.5-vl", "qwen2_5_vl"), ("qwen2_5_vl", "qwen2_5_vl"),
             ("qwen2-vl", "qwen2_vl"), ("qwen2_vl", "qwen2_vl"), ("qwen3", "qwen3"),
             ("qwen2", "qwen2"), ("qwen", "qwen2"), ("llama", "llama"),
             ("mistral", "mistral"), ("smollm", "llama"))


def architecture_of(name_or_path: str) -> str:
    """The transformers model type of a model: a local folder's ``config.json``
    (``model_type``), else the family its name names (``Qwen/Qwen3-8B`` -> ``qwen3``),
    else ``llama`` (what the built-in models are)."""
    config = Path(os.path.expanduser(name_or_path)) / "config.json"
    if config.is_file():
        import json

        model_type = json.loads(config.read_text()).get("model_type")
        if isinstance(model_type, str):
            return model_type
    lowered = name_or_path.lower()
    return next((arch for part, arch in _FAMILIES if part in lowered), "llama")
