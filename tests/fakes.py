"""Tiny stand-ins shared by the tests: a numeric tokenizer and random models built from configs."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM


class ByteTokenizer:
    """A stand-in tokenizer for tiny-vocabulary models: ids are shown as numbers."""
    eos_token_id = None
    chat_template = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def tiny_model(arch: str, vocab: int, seed: int = 0, eos: int | None = None, layers: int = 4, hidden: int = 32,
               intermediate: int = 64):
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  initializer_range=0.3, tie_word_embeddings=False)
    if arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    else:
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=8, **common))
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = 0
    return model.eval().requires_grad_(False)


class CharTokenizer:
    """A stand-in tokenizer that needs no files: every character is one id (its code point modulo the
    vocabulary, above the 3 special ids), no chat template. Loads instantly in a child process."""
    chat_template = None
    eos_token_id = 2
    pad_token_id = 0

    def __init__(self, vocab: int):
        self.vocab = vocab

    def __call__(self, text, add_special_tokens=True):
        return {"input_ids": [1] + [3 + ord(c) % (self.vocab - 3) for c in text]}

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def random_profile(depths: int, n_rank: int, seed: int = 0):
    """A monotone random acceptance profile (rank rates non-increasing in r, calibration non-decreasing
    in log-prob), for the builders that take one."""
    import math

    from jetflow.drafting.builders import AcceptanceProfile
    g = torch.Generator().manual_seed(seed)
    rank = torch.rand(2, depths, n_rank, generator=g).sort(-1, descending=True).values * 0.9
    edges = torch.tensor([-math.inf, -3.0, -2.0, -1.0, -0.5, 0.0])
    cal = torch.rand(2, depths, 5, generator=g).sort(-1).values
    return AcceptanceProfile(rank, edges, cal)


class GlyphTokenizer(CharTokenizer):
    """``CharTokenizer`` whose decode writes punctuation, spaces, newlines, tabs, quotes and angle brackets (one
    character per id), so token labels that must stay visible, and HTML that must stay escaped, show up."""
    TABLE = " ,.\n\tab<>\"'x/"

    def decode(self, ids, skip_special_tokens=True):
        return "".join(self.TABLE[i % len(self.TABLE)] for i in ids)
