"""Weight-only quantized linears (jetflow.engine.quant): exact weights, and lossless decoding on them."""
from __future__ import annotations

import pytest
import torch

from fakes import tiny_model
from jetflow.engine import quant
from jetflow.engine.compiled import CompileConfig, compile_target
from jetflow.engine.decode import generate
from jetflow.engine.target import Target
from test_decode import PROMPTS, stub_proposers

NEW = 16


def test_q4_1_blocks_run_exactly_in_fp32():
    """The kernel's weights (read back through an identity input) are d * code + m exactly: max error 0.0, for
    blocks as a GGUF file makes them (m the block's minimum, d its range / 15, both fp16; arbitrary d and m
    can round m + 8 d)."""
    gen = torch.Generator().manual_seed(0)
    codes, d, m = quant.q4_1_blocks(torch.randn(48, 64, generator=gen))
    layer = quant.from_q4_1(codes, d, m, 64)
    want = d.repeat_interleave(32, 1) * codes + m.repeat_interleave(32, 1)
    assert (quant.dequantize(layer) - want).abs().max().item() == 0.0
    x = torch.randn(5, 64, generator=gen)
    torch.testing.assert_close(layer(x), x @ want.T, rtol=1e-5, atol=1e-5)


def test_q8_0_blocks_run_exactly_as_two_4bit_halves():
    gen = torch.Generator().manual_seed(1)
    q = torch.randint(-128, 128, (48, 64), generator=gen)
    q[0, :4] = torch.tensor([-128, 127, -1, 0])
    d = (torch.rand(48, 2, generator=gen) / 100).half().float()  # fp16 scales, as in the file
    layer = quant.from_q8_0(q, d)
    want = d.repeat_interleave(32, 1) * q
    assert layer.in_features == 64 and (quant.dequantize(layer) - want).abs().max().item() == 0.0
    x = torch.randn(3, 64, generator=gen)
    torch.testing.assert_close(layer(x), x @ want.T, rtol=1e-5, atol=1e-5)


def test_int8_is_per_channel_and_close():
    w = torch.randn(24, 32, generator=torch.Generator().manual_seed(2))
    layer = quant.int8_linear(w, torch.ones(24))
    assert layer.weight_packed.dtype == torch.int8 and layer.scales.shape == (24,)
    torch.testing.assert_close(quant.dequantize(layer), w, rtol=0, atol=float(w.abs().max()) / 254 + 1e-6)


def test_quantize_model_replaces_every_linear_and_refuses_unknown_kinds():
    model = quant.quantize_model(tiny_model("llama", 64, layers=1), "q4")
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert isinstance(model.lm_head, quant.QuantLinear)
    with pytest.raises(ValueError, match="quant must be one of"):
        quant.quantize_model(tiny_model("llama", 64, layers=1), "int3")


@pytest.fixture(scope="module", params=[("llama", "q4", "float32"), ("qwen3", "int8", "bfloat16"),
                                        ("llama", "q4", "bfloat16")])
def quant_target(request, gguf_tokenizer):
    arch, kind, dtype = request.param
    model = tiny_model(arch, 49152, eos=2, layers=2).to(getattr(torch, dtype))
    return Target(quant.quantize_model(model, kind), gguf_tokenizer, f"tiny2-{arch}-{kind}-{dtype}")


def _head_proposers(target):
    from jetflow.drafting.proposers import HeadProposer, LookupMerged
    from jetflow.training.config import TrainConfig
    from jetflow.training.train import build_head
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    head = build_head(TrainConfig(block_size=6, num_layers=1, init="random"), target, rows).eval()
    jetflow = HeadProposer(head, target, "accum_logp", width=3)
    return {"jetflow": jetflow, "dflash-chain": HeadProposer(head, target, "chain"), "jetflow+lookup": LookupMerged(jetflow)}


def test_speculative_output_equals_the_quantized_targets_ar(quant_target):
    """Greedy speculation on a quantized target gives exactly that target's own AR tokens, eager and (q4 in
    bf16, the fast backend; compiling is the slow part of this test) compiled."""
    compiled = None
    if quant_target.name == "tiny2-llama-q4-bfloat16":
        compiled = compile_target(quant_target, CompileConfig(cache_len=128, query_sizes=(1, 9)))
    heads = _head_proposers(quant_target)
    for ids in PROMPTS[:2]:
        for target in (quant_target, compiled) if compiled else (quant_target,):
            own = generate(target, torch.tensor(ids), None, max_new_tokens=NEW).tokens
            for name, proposer in {**stub_proposers(target, own), **heads}.items():
                for budget in (1, 8):
                    res = generate(target, torch.tensor(ids), proposer, budget=budget, max_new_tokens=NEW)
                    assert res.tokens == own, (name, budget, type(target).__name__)
    assert compiled is None or set(compiled.engine.compile_s) == {1, 9}


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi"], ["bench"]])
def test_every_decoding_command_takes_quant(argv):
    from jetflow.cli import build_parser
    parser = build_parser()
    assert parser.parse_args(argv + ["--quant", "q4"]).quant == "q4" and parser.parse_args(argv).quant is None


@pytest.mark.parametrize("native", [True, False])
def test_bench_with_quant_computes_in_bf16_where_native(monkeypatch, tmp_path, native):
    """``bench --quant`` without ``--dtype`` feeds the packed kernels bf16 where the CPU has it (fp32 inputs run them
    10-40x slower), as ``generate`` does; an explicit ``--dtype`` wins."""
    import jetflow.commands as commands
    from jetflow.cli import main
    from jetflow.util import hardware
    monkeypatch.setattr(hardware, "fast_dtype", lambda device: ("bfloat16", "native") if native else ("float32", "no"))
    seen = []

    class Stop(Exception):
        pass

    def spy(*args, **kwargs):
        seen.append(kwargs["dtype"])
        raise Stop
    monkeypatch.setattr(commands, "load_for_run", spy)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "hi"}\n')
    for extra in ([], ["--dtype", "float32"]):
        with pytest.raises(Stop):
            main(["bench", "--quant", "q4", "--methods", "ar", "--prompts-file", str(prompts), *extra])
    assert seen == ["bfloat16" if native else "float32", "float32"]


@pytest.mark.slow
def _block_weights(kind, *blocks):
    """The (N, K) fp32 weights a GGUF block set stands for: Q4_1 d * code + m, Q8_0 d * q (per 32 inputs)."""
    codes, d = blocks[0].float(), blocks[1]
    grouped = codes.reshape(codes.shape[0], -1, quant.GROUP) * d[..., None]
    if kind == "q4_1":
        grouped = grouped + blocks[2][..., None]
    return grouped.reshape(codes.shape)


def test_embedded_q4_carries_the_files_blocks_exactly(smol):
    """The file's blocks are the fp32 target's (dequantized GGUF) weights exactly, on all 211 linears; and the
    packed kernel computes those blocks exactly in fp32, read back through an identity input on layer 0's seven
    linears and the first 2,048 rows of the Q8_0 lm_head (the rest of the layers have the same shapes and kinds;
    reading all 211 back through the fp32 kernel path took ~4 min)."""
    from jetflow.engine.load import embedded_gguf
    blocks = quant.gguf_blocks(embedded_gguf())
    kinds = {b[0] for b in blocks.values()}
    assert blocks["lm_head"][0] == "q8_0" and kinds == {"q4_1", "q8_0"} and len(blocks) == 30 * 7 + 1
    linears = {n: m for n, m in smol.model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert set(linears) == set(blocks)
    for name, (kind, *b) in blocks.items():
        assert torch.equal(_block_weights(kind, *b), linears[name].weight.float()), name
    rows = 2048
    read_back = [n for n in blocks if n.startswith("model.layers.0.")] + ["lm_head"]
    assert len(read_back) == 8
    for name in read_back:
        kind, *b = blocks[name]
        if name == "lm_head":
            b = [t[:rows] for t in b]
            linear = torch.nn.Linear(b[0].shape[1], rows, bias=False)
            linear.weight.data = linears[name].weight.data[:rows].float()
        else:
            linear = linears[name]
        layer = quant.quant_layer("q4", name, linear, {name: (kind, *b)}, torch.float32)
        assert (quant.dequantize(layer) - _block_weights(kind, *b)).abs().max().item() == 0.0, name


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["q4"])
def test_embedded_quantized_speculation_equals_its_own_ar(kind):
    """On the embedded target quantized (bf16 activations, the fast backend), every decoding method's greedy
    output equals the same quantized target's AR on one GSM8K-style prompt, 16 tokens: every method's drafting
    runs end to end on the packed linears. Exact by construction, not by this prompt's margins: the target
    attends with ``jetflow.engine.invariant``'s exact attention (tests/test_invariant.py checks the rows)."""
    from jetflow.drafting import methods as registry
    from jetflow.drafting.methods import make_proposer
    from jetflow.engine.load import load_target
    target = load_target(None, dtype="bfloat16", quant=kind)
    prompt = "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?"
    ref = generate(target, prompt, None, max_new_tokens=16).tokens
    for method in registry.names(lambda m: m.decodes and m.name != "ar" and not m.correction):  # ablation corrections live beside the pool1 head only
        got = generate(target, prompt, make_proposer(method, target), budget=8, max_new_tokens=16).tokens
        assert got == ref, method


@pytest.mark.slow
def test_embedded_q4_tree_rows_equal_its_ar_steps():
    """On the embedded target in q4 (exact attention on by default): a 12-node tree verify's rows equal the AR
    steps along their paths (tests/test_invariant.py does it at every node on tiny targets)."""
    from jetflow.engine import invariant
    from jetflow.engine.load import load_target
    from test_invariant import assert_rows_are_ar_steps, random_tree
    target = load_target(None, dtype="bfloat16", quant="q4")  # the same load as the test above, in this worker
    assert target.model.config._attn_implementation == invariant.EXACT
    assert type(target).__name__ == "LeanTarget"  # a CPU's q4 decodes through the lean forward (engine/lean.py)
    prompt = target.encode("What is the sum of all positive divisors of 36?")
    assert_rows_are_ar_steps(target, prompt, random_tree(12, 3), (1, 5, 8, 11))
