"""Layer 3, models: built-in models by name, loading and saving, tokenizers, SFT warm-up,
LoRA, weight naming and the memory levers that move weights between device and host.

No Ray here.  The public helpers are re-exported for ``from rllib_grpo.models import ...``.
"""

from rllib_grpo.models.loading import (
    DTYPES,
    VLLM_HEAD_SIZES,
    ModelAndTokenizer,
    build_tiny_causal_lm,
    load_causal_lm,
    save_model_dir,
    torch_dtype,
)
from rllib_grpo.models.model_registry import (
    builtin_model_names,
    default_cache_dir,
    needs_build,
    register_builtin_model,
    resolve_model,
)
from rllib_grpo.models.sft import sft_warmup
from rllib_grpo.models.tokenizers import (
    DEFAULT_ALPHABET,
    SPECIAL_TOKENS,
    build_char_tokenizer,
    load_tokenizer,
)

__all__ = [
    "DEFAULT_ALPHABET", "DTYPES", "SPECIAL_TOKENS", "VLLM_HEAD_SIZES", "ModelAndTokenizer",
    "build_char_tokenizer", "build_tiny_causal_lm", "builtin_model_names", "default_cache_dir",
    "load_causal_lm", "load_tokenizer", "needs_build", "register_builtin_model", "resolve_model",
    "save_model_dir", "sft_warmup", "torch_dtype",
]
