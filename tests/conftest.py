"""Shared fixtures: tiny random targets built from configs, and the embedded SmolLM2 (slow)."""
from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from fakes import ByteTokenizer, tiny_model
from jetflow.engine.target import Target
from jetflow.engine.load import embedded_gguf, load_target


def pytest_collection_modifyitems(items):
    """Every test that loads the embedded SmolLM2 (the ``smol`` fixture) is ``slow``, so
    ``pytest -m "not slow"`` is the fast unit run."""
    for item in items:
        if "smol" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


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
