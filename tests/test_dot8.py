"""The q4x8 backend (jetflow.engine.dot8): GGUF-style blocks times 8-bit activations in C. Held to the block formula,
each row computed alone (rows together equal rows one by one, bit for bit), a tree verify's rows equal the AR steps
and speculation equals AR on a tiny Llama, eager and compiled."""
from __future__ import annotations

import pytest
import torch

from fakes import CharTokenizer, tiny_model
from jetflow.engine import dot8, lean, lean_compiled, quant
from jetflow.engine.decode import generate
from jetflow.engine.invariant import make_invariant
from jetflow.engine.load import backend_of
from jetflow.engine.target import Target
from test_decode import stub_proposers
from test_invariant import VOCAB, assert_rows_are_ar_steps, random_tree

pytestmark = pytest.mark.skipif(not dot8.available(), reason="no C compiler here: no q4x8 backend")


def q4_layer(n: int = 96, k: int = 128, seed: int = 0):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.1
    codes, d, m = quant.q4_1_blocks(w)
    return dot8.from_q4_1(codes, d, m, torch.float32), codes, d, m


def q8_layer(n: int = 96, k: int = 128, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int32).to(torch.int8)
    d = (torch.rand(n, k // 32, generator=gen) * 0.01).half().float()  # fp16 values, as in a GGUF file
    return dot8.from_q8_0(q, d, torch.float32), q, d


def reference(x: torch.Tensor, weight_codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The block formula in float64: x quantized per row and block of 32 as the kernel does (fp32 steps), then
    sum over blocks of d * dx * sum(code * qx) + m * dx * sum(qx)."""
    t, k = x.shape
    blocks = x.reshape(t, k // 32, 32)
    amax = blocks.abs().amax(-1)
    inverse = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    qx = torch.round(blocks * inverse[..., None]).double()
    dx = (amax / 127).double()
    codes = weight_codes.double().reshape(weight_codes.shape[0], k // 32, 32)
    dots = torch.einsum("tbi,nbi->tnb", qx, codes)
    return (dots * dx[:, None] * d.double()[None] + m.double()[None] * (dx * qx.sum(-1))[:, None]).sum(-1)


def test_q4_blocks_follow_the_formula():
    layer, codes, d, m = q4_layer()
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(2))
    want = reference(x, codes, d, m)
    assert torch.allclose(layer(x).double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert torch.equal(layer.weight, (codes.float().reshape(96, 4, 32) * d[..., None] + m[..., None]).reshape(96, 128))


def test_q8_blocks_follow_the_formula():
    layer, q, d = q8_layer()
    x = torch.randn(5, 128, generator=torch.Generator().manual_seed(3))
    want = reference(x, q.to(torch.int32), d, torch.zeros_like(d))
    assert torch.allclose(layer(x).double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    assert torch.equal(layer.weight, (q.float().reshape(96, 4, 32) * d[..., None]).reshape(96, 128))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_together_equal_rows_alone(dtype, threads):
    """Heavy-tailed rows (normal times log-normal), 1 to 17 per call: every row equals the same row computed alone,
    on one thread and with the outputs split between two (OpenMP, torch's own threads)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows_alone(dtype)
    finally:
        torch.set_num_threads(before)


def rows_alone(dtype):
    gen = torch.Generator().manual_seed(4)
    for layer in (q4_layer()[0], q8_layer()[0]):
        layer = dot8.Dot8Linear(*layer.blocks()[:1], layer.bits, *layer.blocks()[1:], dtype)
        kernel = layer.kernel()
        for t in (2, 5, 17):
            x = (torch.randn(t, 128, generator=gen) * torch.exp(2 * torch.randn(t, 128, generator=gen))).to(dtype)
            together = kernel(x)
            assert together.dtype == dtype
            assert torch.equal(together, torch.cat([kernel(x[i:i + 1]) for i in range(t)]))


def test_fused_layers_equal_the_separate_ones():
    a, b = q4_layer(64, 128, 5)[0], q4_layer(32, 128, 6)[0]
    x = torch.randn(3, 128)
    assert torch.equal(quant.fuse([a, b])(x), torch.cat([a(x), b(x)], -1))
    with pytest.raises(ValueError, match="one code width"):
        dot8.fuse([a, q8_layer()[0]])


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="multiple of 64"):
        dot8.from_q4_1(*quant.q4_1_blocks(torch.randn(8, 96)), torch.float32)
    layer = q4_layer()[0]
    with pytest.raises(ValueError, match="inputs"):
        layer.kernel()(torch.randn(2, 64))


def tiny_q4x8(layers: int = 2) -> lean.LeanTarget:
    """A tiny Llama whose widths are whole pairs of blocks (the kernel's unit: 64 inputs), as q4x8 through the lean
    forward."""
    model = tiny_model("llama", VOCAB, eos=2, layers=layers, hidden=64, intermediate=128).to(torch.bfloat16)
    model = make_invariant(quant.quantize_model(model, "q4x8"))
    return lean.lean_target(Target(model, CharTokenizer(VOCAB), "tiny-q4x8"))


@pytest.fixture(scope="module")
def target():
    return tiny_q4x8()


@pytest.mark.parametrize("past", [5, 70])
def test_every_tree_row_equals_the_ar_step_at_its_node(target, past):
    assert backend_of(target) == "q4x8"
    prompt = torch.randint(3, VOCAB, (past,), generator=torch.Generator().manual_seed(past))
    assert_rows_are_ar_steps(target, prompt, random_tree(17, past), range(17))


def test_greedy_speculation_equals_ar_eager_and_compiled(target):
    compiled = lean_compiled.compile_lean(target)
    compiled.warm()
    assert backend_of(compiled) == "q4x8-compiled"
    ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(0))
    for t in (target, compiled):
        own = generate(t, ids, None, max_new_tokens=20).tokens
        for name, proposer in stub_proposers(t, own).items():
            assert generate(t, ids, proposer, budget=8, max_new_tokens=20).tokens == own, (backend_of(t), name)
