"""Row invariance (jetflow.engine.invariant): exact attention computes a verify's rows bit for bit as AR steps do."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fakes import CharTokenizer, tiny_model
from jetflow.engine import invariant, quant
from jetflow.engine.decode import generate
from jetflow.engine.target import Target, check_supported
from jetflow.engine.tree import Tree
from jetflow.engine.verify import tree_attention_mask
from test_decode import stub_proposers

VOCAB = 320  # the int4 packing wants output rows in multiples of 16


def random_tree(n: int, seed: int) -> Tree:
    """A random tree of ``n`` nodes (parents first), tokens in the tiny vocabulary."""
    gen = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
    return Tree.from_lists(torch.randint(3, VOCAB, (n,), generator=gen).tolist(), parents)


def path_to(tree: Tree, node: int) -> list[int]:
    path = [node]
    while int(tree.parents[path[-1]]) >= 0:
        path.append(int(tree.parents[path[-1]]))
    return path[::-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_attention_agrees_with_sdpa(dtype):
    """Same attention as SDPA up to rounding: a tree mask, a causal chain (no mask) and one AR step, past the
    prefix; the prefill goes to SDPA itself."""
    torch.manual_seed(0)
    heads, kv_heads, dim, past, t = 6, 2, 16, 70, 9
    tree = random_tree(t, 1)
    mask = tree_attention_mask(tree, past, dtype, torch.device("cpu"))
    q = torch.randn(1, heads, t, dim, dtype=dtype)
    k, v = torch.randn(1, kv_heads, past + t, dim, dtype=dtype), torch.randn(1, kv_heads, past + t, dim, dtype=dtype)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for m in (mask, None):
        got, _ = invariant.exact_attention(None, q, k, v, m, scaling=dim ** -0.5)
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=m if m is not None else torch.ones(
            t, past + t, dtype=torch.bool).tril(past), enable_gqa=True).transpose(1, 2)
        assert got.shape == (1, t, heads, dim) and got.dtype == dtype
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol)
    one, _ = invariant.exact_attention(None, q[:, :, :1], k, v, None, scaling=dim ** -0.5)
    want = F.scaled_dot_product_attention(q[:, :, :1], k, v, enable_gqa=True).transpose(1, 2)
    assert torch.allclose(one.float(), want.float(), atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="one sequence"):
        invariant.exact_attention(None, q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1),
                                  None)
    batch = torch.randn(2, heads, t, dim, dtype=dtype), torch.randn(2, kv_heads, t, dim, dtype=dtype)
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, heads // kv_heads
    got, _ = invariant.exact_attention(module, batch[0], batch[1], batch[1], None, scaling=dim ** -0.5)
    want = F.scaled_dot_product_attention(batch[0], batch[1], batch[1], is_causal=True, enable_gqa=True)
    assert torch.allclose(got.float(), want.transpose(1, 2).float(), atol=tol, rtol=tol)  # a batch without a cache


@pytest.fixture(scope="module", params=["q4", "int8"])
def exact_target(request):
    model = tiny_model("llama", VOCAB, eos=2, layers=3).to(torch.bfloat16)
    model = invariant.make_invariant(quant.quantize_model(model, request.param))
    check_supported(model)
    return Target(model, CharTokenizer(VOCAB), f"tiny-{request.param}-exact")


@pytest.mark.parametrize("past", [5, 60, 130])
def test_every_tree_row_equals_the_ar_step_at_its_node(exact_target, past):
    """Every row of one tree verify (17 nodes, paths up to the 64-key bucket's edge and across it) has logits
    equal, bit for bit, to the AR step that reaches its node token by token along its path."""
    target = exact_target
    prompt = torch.randint(3, VOCAB, (past,), generator=torch.Generator().manual_seed(past))
    tree = random_tree(17, past)
    assert_rows_are_ar_steps(target, prompt, tree, range(len(tree)))


def assert_rows_are_ar_steps(target, prompt: torch.Tensor, tree: Tree, nodes) -> None:
    """One verify of ``tree`` after ``prompt``: each of ``nodes`` has logits equal, bit for bit, to the AR step that
    reaches it token by token along its path."""
    cache = target.new_cache()
    target.forward(prompt, cache)
    past = cache.get_seq_length()
    rows = target.forward(tree.tokens, cache, positions=tree.depth + past,
                          mask=tree_attention_mask(tree, past, target.dtype, target.device)).logits
    for node in nodes:
        cache = target.new_cache()
        target.forward(prompt, cache)
        for token in tree.tokens[path_to(tree, node)]:
            step = target.forward(token.reshape(1), cache).logits
        assert torch.equal(step[-1], rows[node]), node


def test_greedy_speculation_equals_ar_on_the_exact_target(exact_target):
    for seed in (0, 1):
        ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(seed))
        own = generate(exact_target, ids, None, max_new_tokens=24).tokens
        for name, proposer in stub_proposers(exact_target, own).items():
            for budget in (3, 16):
                assert generate(exact_target, ids, proposer, budget=budget, max_new_tokens=24).tokens == own, name


def test_packed_linears_are_row_invariant_on_heavy_tailed_rows():
    """The int8, int4 and q4x8 kernels compute each row alone at 2-33 rows (what exact speculation on them rests on);
    q4x8 takes whole pairs of blocks, so its model is twice as wide."""
    for kind in quant.QUANTS:
        wide = {"hidden": 64, "intermediate": 128} if kind == "q4x8" else {}
        model = quant.quantize_model(tiny_model("llama", VOCAB, layers=1, **wide).to(torch.bfloat16), kind)
        found = invariant.row_invariant(model)
        assert found and all(v == [] for v in found.values()), (kind, found)
