"""tools/attention_invariance.py's fp32 attention is attention (docs/speed.md rests on its decode counts): equal to
a float64 softmax(q k^T / sqrt(d) + mask) v under a tree mask, a boolean mask and the causal prefill it builds
itself when transformers passes no mask; registered, a tiny model decodes through it and its tree mask."""
import importlib.util
from pathlib import Path

import pytest
import torch

from fakes import ByteTokenizer, tiny_model
from jetflow.drafting.proposers import OracleProposer
from jetflow.engine.decode import generate
from jetflow.engine.target import Target

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("attention_invariance", ROOT / "tools" / "attention_invariance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reference(q, k, v, mask):
    rep = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    scores = q.double() @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask.double()
    return (torch.softmax(scores, -1) @ v).transpose(1, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp32_attention_is_attention_under_every_mask(tool, dtype):
    torch.manual_seed(0)
    q = torch.randn(1, 4, 5, 8, dtype=dtype)
    k, v = torch.randn(1, 2, 9, 8, dtype=dtype), torch.randn(1, 2, 9, 8, dtype=dtype)
    tree = torch.zeros(1, 1, 5, 9)
    tree[..., 4:].masked_fill_(torch.rand(5, 5) < 0.5, torch.finfo(torch.float32).min)  # a tree over 4 cached rows
    tree[..., 4:].diagonal(dim1=-2, dim2=-1).zero_()
    out, weights = tool.fp32_attention(None, q, k, v, tree.to(dtype))
    assert weights is None and out.dtype == dtype and out.shape == (1, 5, 4, 8)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert torch.allclose(out.double(), reference(q, k, v, tree), atol=tol)
    causal = torch.full((5, 9), float("-inf")).triu(9 - 5 + 1)[None, None]  # query i sees keys 0..4 + i
    no_mask, _ = tool.fp32_attention(None, q, k, v, None)
    assert torch.allclose(no_mask.double(), reference(q, k, v, causal), atol=tol)
    assert torch.equal(tool.fp32_attention(None, q, k, v, causal == 0)[0], no_mask)


def test_a_registered_fp32_attention_decodes_trees_like_ar(tool, monkeypatch):
    import jetflow.engine.target as target_module
    monkeypatch.setattr(target_module, "ATTENTION", target_module.ATTENTION)  # register() widens it: undone after
    model = tiny_model("qwen3", 64, seed=3)
    model.set_attn_implementation(tool.register())
    target = Target(model=model, tokenizer=ByteTokenizer(), name="tiny qwen3, fp32 attention")
    ids = torch.randint(3, 64, (12,), generator=torch.Generator().manual_seed(1))
    ar = generate(target, ids, None, max_new_tokens=24)
    tree = generate(target, ids, OracleProposer(ar.tokens, 64, wrong_at=3, siblings=3), budget=16, max_new_tokens=24)
    assert tree.tokens == ar.tokens and tree.tau > 2.5  # two drafts accepted a round, through a bushy tree
    model.set_attn_implementation("sdpa")
    assert generate(target, ids, None, max_new_tokens=24).tokens == ar.tokens  # fp32: the same answer as SDPA
