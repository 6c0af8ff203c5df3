"""The lean forward (jetflow.engine.lean): transformers' forward without its module stack, held to transformers'
forward and to its own AR steps bit for bit."""
from __future__ import annotations

import pytest
import torch

from fakes import CharTokenizer, tiny_model
from jetflow.engine import invariant, lean, quant, row_attention
from jetflow.engine.decode import generate
from jetflow.engine.target import Target, keep_path
from jetflow.engine.verify import tree_attention_mask
from test_decode import stub_proposers
from test_invariant import VOCAB, assert_rows_are_ar_steps, random_tree

BACKENDS = {"q4": (torch.bfloat16, "q4"), "int8": (torch.bfloat16, "int8"), "fp32": (torch.float32, None)}


def pair(backend: str, layers: int = 3) -> tuple[Target, lean.LeanTarget]:
    """A tiny Llama target of ``backend`` through transformers (exact attention where quantized) and through the
    lean forward, sharing one model."""
    dtype, kind = BACKENDS[backend]
    model = tiny_model("llama", VOCAB, eos=2, layers=layers).to(dtype)
    if kind is not None:
        model = invariant.make_invariant(quant.quantize_model(model, kind))
    hf = Target(model, CharTokenizer(VOCAB), f"tiny-{backend}")
    return hf, lean.lean_target(hf)


@pytest.fixture(scope="module", params=list(BACKENDS))
def targets(request):
    return pair(request.param)


@pytest.mark.parametrize("rows_in_c", [False, True])
def test_lean_forward_agrees_with_transformers(targets, rows_in_c):
    """A prefill, AR steps and a tree verify give transformers' logits and taps (the last layer's after the final norm,
    as transformers reports it): bit for bit on the quantized backends when the lean forward attends through the same
    torch ops (``invariant.attend``) as transformers' exact attention; to rounding through the C row attention, and in
    fp32, where transformers attends with SDPA."""
    with row_attention.switched(rows_in_c):
        compare_with_transformers(*targets, exact=not rows_in_c)


def compare_with_transformers(hf, lt, exact: bool):
    prompt = torch.randint(3, VOCAB, (70,), generator=torch.Generator().manual_seed(0))
    caches = hf.new_cache(), lt.new_cache()
    steps = [t.forward(prompt, c, taps=(0, 2)) for t, c in zip((hf, lt), caches)]
    for token in (5, 9, 11):
        steps += [t.forward(torch.tensor([token]), c, taps=(1,)) for t, c in zip((hf, lt), caches)]
    tree = random_tree(9, 3)
    past = caches[0].get_seq_length()
    assert caches[1].get_seq_length() == past
    for t, c in zip((hf, lt), caches):
        steps.append(t.forward(tree.tokens, c, positions=tree.depth + past, taps=(0, 1, 2),
                               mask=tree_attention_mask(tree, past, t.dtype, t.device)))
    exact = exact and hf.model.config._attn_implementation == invariant.EXACT
    for want, got in zip(steps[::2], steps[1::2]):
        assert got.logits.shape == want.logits.shape and got.taps.shape == want.taps.shape
        assert got.logits.dtype == torch.float32
        if exact:
            assert torch.equal(got.logits, want.logits) and torch.equal(got.taps, want.taps)
        else:
            assert torch.allclose(got.logits, want.logits, atol=2e-4, rtol=1e-4)
            assert torch.allclose(got.taps.float(), want.taps.float(), atol=2e-4, rtol=1e-4)

@pytest.mark.parametrize("rows_in_c", [True, False])
@pytest.mark.parametrize("backend", ["q4", "int8"])
@pytest.mark.parametrize("past", [5, 60, 130, 300])
def test_every_tree_row_equals_the_lean_ar_step_at_its_node(backend, past, rows_in_c):
    """Every row of a 17-node tree verify equals, bit for bit, the lean AR step that reaches its node (prefixes across
    the 64-key bucket edge and past the cache's first 256 rows, which it then grows), through the C row attention
    and through the torch ops alike."""
    _, lt = pair(backend)
    prompt = torch.randint(3, VOCAB, (past,), generator=torch.Generator().manual_seed(past))
    with row_attention.switched(rows_in_c):
        assert_rows_are_ar_steps(lt, prompt, random_tree(17, past), range(17))


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_greedy_speculation_equals_lean_ar(backend):
    _, lt = pair(backend)
    for seed in (0, 1):
        ids = torch.randint(3, VOCAB, (40,), generator=torch.Generator().manual_seed(seed))
        own = generate(lt, ids, None, max_new_tokens=24).tokens
        for name, proposer in stub_proposers(lt, own).items():
            for budget in (3, 16):
                assert generate(lt, ids, proposer, budget=budget, max_new_tokens=24).tokens == own, (name, budget)


def test_cache_keeps_the_accepted_rows_and_grows():
    """``LeanKV.keep_path`` keeps the rows ``target.keep_path`` keeps on a dynamic cache; ``reserve`` keeps the live
    rows when it grows."""
    kv = lean.LeanKV(layers=2, kv_heads=1, dim=3, device="cpu", rows=8)
    kv.keys[:, :, :7] = torch.arange(7.0)[None, None, :, None]
    kv.length = 7
    kv.reserve(20)
    assert kv.keys.shape[2] == 20 and torch.equal(kv.keys[0, 0, :7, 0], torch.arange(7.0))
    kv.keep_path(3, [1, 3])
    assert kv.get_seq_length() == 5 and kv.keys[1, 0, :5, 0].tolist() == [0, 1, 2, 4, 6]
    keep_path(kv, 2, [])  # the engine's keep_path hands a self-compacting cache its own
    assert kv.get_seq_length() == 2


@pytest.mark.parametrize("kind", ["q4", "int8", None])
def test_fused_linears_equal_the_separate_ones(kind):
    layers = [torch.nn.Linear(64, n, bias=False).to(torch.bfloat16) for n in (128, 64, 32)]
    if kind is not None:
        layers = [quant.quant_layer(kind, "", layer, {}, torch.bfloat16) for layer in layers]
    x = torch.randn(5, 64).to(torch.bfloat16)
    fused = quant.fuse(layers)
    assert torch.equal(fused(x), torch.cat([layer(x) for layer in layers], -1))
    kernel = fused.kernel() if kind else fused
    assert torch.equal(kernel(x), fused(x))
    with pytest.raises(ValueError, match="one kind"):
        quant.fuse([layers[0], torch.nn.Linear(32, 8)])


def test_other_architectures_are_refused_with_the_reason():
    model = tiny_model("qwen3", VOCAB, layers=1)
    assert "qwen3" in lean.unsupported(model)
    with pytest.raises(ValueError, match="lean forward cannot run"):
        lean.lean_target(Target(model, CharTokenizer(VOCAB), "tiny-qwen3"))
    hf, lt = pair("fp32", layers=1)
    with pytest.raises(ValueError, match="own cache"):
        lt.forward(torch.tensor([3]), hf.new_cache())
    assert lean.lean_target(lt) is lt


def test_q4_fuses_whole_packing_blocks_only():
    layers = [quant.quant_layer("q4", "", torch.nn.Linear(64, n, bias=False), {}, torch.bfloat16) for n in (32, 32)]
    with pytest.raises(ValueError, match="multiple of 64"):
        quant.fuse(layers)


def test_the_tools_comparison_runs_on_a_tiny_target():
    """tools/lean_forward.py (docs/speed.md quotes it): both forwards give the same logits on a tiny q4 target, and
    the kernel share it reports is a share."""
    import importlib.util
    from pathlib import Path
    spec = importlib.util.spec_from_file_location("lean_forward", Path(__file__).resolve().parents[1] / "tools" /
                                                  "lean_forward.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    hf, lt = pair("q4")
    ids = torch.randint(3, VOCAB, (30,), generator=torch.Generator().manual_seed(1))
    assert tool.same_logits(hf, lt, ids)
    assert 0 < tool.kernel_share(lt, ids, steps=2) <= 1
    assert tool.verify_ms(lt, ids, 4) > 0 and set(tool.lm_head_ms(lt, rows=(1, 2), repeats=1)) == {1, 2}
