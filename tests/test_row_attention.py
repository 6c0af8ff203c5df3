"""The C row attention (jetflow.engine.row_attention): every row computed alone, so a tree verify's rows equal the AR
steps at their nodes bit for bit; close to invariant.attend; clear errors; off, it steps aside for the torch ops."""
from __future__ import annotations

import pytest
import torch

from jetflow.engine import row_attention as ra
from jetflow.engine.invariant import Plan, attend, visible_keys
from jetflow.engine.verify import tree_attention_mask
from test_invariant import path_to, random_tree

pytestmark = pytest.mark.skipif(not ra.available(), reason="no C compiler here: the lean forward uses torch ops")

HEADS, KV_HEADS, DIM = 6, 2, 32


def inputs(t: int, past: int, dtype, seed: int = 0, cap: int = 512):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, HEADS + 2 * KV_HEADS, DIM, generator=gen).to(dtype)  # q, k, v as strided views of one tensor
    keys = torch.randn(KV_HEADS, cap, DIM, generator=gen)
    values = torch.randn(KV_HEADS, cap, DIM, generator=gen)
    return qkv[:, :HEADS], qkv[:, HEADS:HEADS + KV_HEADS], qkv[:, HEADS + KV_HEADS:], keys, values


def visible(tree, past: int) -> torch.Tensor:
    return visible_keys(tree_attention_mask(tree, past, torch.float32, torch.device("cpu")), len(tree.tokens),
                        past + len(tree.tokens), "cpu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("past", [0, 5, 70, 300])
def test_every_tree_row_equals_the_same_row_computed_alone(dtype, past):
    """A 17-node tree in one call; then each node alone, as the AR step at it sees the cache: the prefix, then its
    path's keys and values in order, itself last. Equal bit for bit, whatever the row count."""
    tree = random_tree(17, past + 1)
    q, k, v, keys, values = inputs(17, past, dtype, seed=past)
    together = ra.row_attention(q, k, v, keys, values, past, visible(tree, past), 0.3)
    assert together.dtype == dtype and together.shape == (17, HEADS, DIM)
    for node in range(17):
        path = path_to(tree, node)
        alone_keys, alone_values = keys.clone(), values.clone()
        rows = [past + p for p in path[:-1]]
        alone_keys[:, past:past + len(rows)] = keys[:, rows]
        alone_values[:, past:past + len(rows)] = values[:, rows]
        alone = ra.row_attention(q[node:node + 1], k[node:node + 1], v[node:node + 1], alone_keys, alone_values,
                                 past + len(rows), None, 0.3)
        assert torch.equal(alone[0], together[node]), node


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_close_to_the_torch_exact_attention_and_writes_the_cache(dtype):
    """Same attention as ``invariant.attend`` up to rounding (a tree, a causal chain, one AR step), and the new rows'
    k and v land in the cache at rows past..past+T, in fp32."""
    past = 70
    for t, tree in ((9, random_tree(9, 3)), (5, None), (1, None)):
        q, k, v, keys, values = inputs(t, past, dtype, seed=t)
        seen = visible(tree, past) if tree is not None else None
        got = ra.row_attention(q, k, v, keys, values, past, seen, 0.25)
        assert torch.equal(keys[:, past:past + t], k.float().transpose(0, 1))
        assert torch.equal(values[:, past:past + t], v.float().transpose(0, 1))
        mask = seen if seen is not None else visible_keys(None, t, past + t, "cpu")
        (_, idx, masked), = Plan(mask).groups
        want = attend(q, keys[:, idx], values[:, idx], masked, 0.25)
        tol = 1e-5 if dtype == torch.float32 else 1e-2
        assert torch.allclose(got.float(), want.float(), atol=tol, rtol=tol), t


def test_bad_inputs_raise_and_leave_the_cache_alone():
    q, k, v, keys, values = inputs(4, 10, torch.float32)
    before = keys.clone()
    with pytest.raises(ValueError, match="visible must be"):
        ra.row_attention(q, k, v, keys, values, 10, torch.ones(4, 10, dtype=torch.bool), 0.3)
    with pytest.raises(ValueError, match="no room"):
        ra.row_attention(q, k, v, keys[:, :12].contiguous(), values[:, :12].contiguous(), 10, None, 0.3)
    with pytest.raises(ValueError, match="do not fit"):
        ra.row_attention(q, k[:, :1], v[:, :1], keys, values, 10, None, 0.3)
    assert torch.equal(keys, before)


def test_switched_off_it_steps_aside():
    """Off (or for a dtype it does not take), it returns None: the lean forward then attends through torch ops."""
    q, k, v, keys, values = inputs(2, 10, torch.float32)
    with ra.switched(False):
        assert not ra.available()
        assert ra.row_attention(q, k, v, keys, values, 10, None, 0.3) is None
    assert ra.available()
    half = [x.half() for x in (q, k, v)]
    assert ra.row_attention(*half, keys, values, 10, None, 0.3) is None
