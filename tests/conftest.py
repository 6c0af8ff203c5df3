"""Shared fixtures: tiny random targets built from configs, and the embedded SmolLM2 (slow)."""
from __future__ import annotations

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from jetflow.target import Target, embedded_gguf, load_target


class ByteTokenizer:
    """A stand-in tokenizer for tiny-vocabulary models: ids are shown as numbers."""
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def tiny_model(arch: str, vocab: int, seed: int = 0, eos: int | None = None):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.3, tie_word_embeddings=False)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def gguf_tokenizer():
    path = embedded_gguf()
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


@pytest.fixture(scope="session", params=["llama", "qwen3"])
def tiny_target(request, gguf_tokenizer):
    """A random 4-layer model over SmolLM2's vocabulary; EOS = 2 as in SmolLM2."""
    model = tiny_model(request.param, gguf_tokenizer.vocab_size if hasattr(gguf_tokenizer, "vocab_size") else 49152, eos=2)
    return Target(model, gguf_tokenizer, f"tiny-{request.param}")


@pytest.fixture
def small_vocab_target():
    """A random 4-layer Llama over 6 tokens and no EOS: for exact distribution tests."""
    return Target(tiny_model("llama", 6, seed=1), ByteTokenizer(), "tiny-vocab6")


@pytest.fixture(scope="session")
def smol():
    return load_target(None, dtype="float32")
