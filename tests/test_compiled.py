"""The compiled target on tiny random targets: same greedy tokens as eager, the padded-tree mask,
static-cache compaction against ``keep_path`` on a dynamic cache, sampling's distribution.

Graphs compile on first use (~10-40 s each for a tiny model on one core, less once inductor's cache
holds them), so the compiled targets are 2-layer models built once per module with two query sizes."""
import pytest
import torch
from transformers import DynamicCache

from fakes import ByteTokenizer, tiny_model
from jetflow.engine.compiled import CompileConfig, StaticKV, compile_target, padded_mask
from jetflow.engine.decode import generate
from jetflow.drafting.proposers import (CompiledHeadProposer, HeadProposer, LookupMerged, LookupProposer, OracleProposer,
                                       RandomProposer)
from jetflow.engine.target import Target, keep_path
from jetflow.engine.tree import Tree
from jetflow.engine.verify import tree_attention_mask

from test_decode import PROMPTS, exact_prefix_probs, hf_greedy
from test_decode import test_sampling_matches_target_distribution as eager_distribution_test

NEW = 20
SIZES = (1, 9)  # AR and budget-8 trees: two graphs per tiny target


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def eager_target(request, gguf_tokenizer):
    """A random 2-layer model over SmolLM2's vocabulary (EOS = 2): the fewer layers, the faster it compiles."""
    return Target(tiny_model(request.param, 49152, eos=2, layers=2), gguf_tokenizer, f"tiny2-{request.param}")


@pytest.fixture(scope="module")
def compiled(eager_target):
    return compile_target(eager_target, CompileConfig(cache_len=128, query_sizes=SIZES))


def reference_padded(mask, past, size, padded, cache_len):
    """Loop reference: real rows as given (or causal), pads see only themselves, the rest masked."""
    allowed = torch.zeros(padded, cache_len, dtype=torch.bool)
    for i in range(padded):
        for j in range(cache_len):
            if i >= size:
                allowed[i, j] = j == past + i
            elif j < past + size:
                allowed[i, j] = bool(mask[0, 0, i, j] == 0) if mask is not None else j <= past + i
    return allowed


TREES = [Tree.from_lists([5], [-1]), Tree.from_lists([5, 6, 7, 8], [-1, 0, 0, 1]),
         Tree.from_lists([5, 6, 7, 8, 9, 3], [-1, 0, 1, 2, 0, 4])]


@pytest.mark.parametrize("tree", TREES, ids=lambda t: f"n{len(t)}")
@pytest.mark.parametrize("past,padded", [(0, 9), (3, 9), (7, 17)])
@pytest.mark.parametrize("causal", [False, True])
def test_padded_mask_equals_the_unpadded_one_on_real_nodes(tree, past, padded, causal):
    mask = None if causal else tree_attention_mask(tree, past)
    full = padded_mask(mask, past, len(tree), padded, 32)
    assert full.shape == (1, 1, padded, 32)
    assert torch.equal(full[0, 0] == 0, reference_padded(mask, past, len(tree), padded, 32))
    if mask is not None:  # the real block is the unpadded mask itself
        assert torch.equal(full[..., :len(tree), :past + len(tree)], mask)


def test_padded_mask_rejects_what_does_not_fit():
    with pytest.raises(ValueError, match="cannot pad 4 query rows to 9 after 30"):
        padded_mask(None, 30, 4, 9, 32)
    with pytest.raises(ValueError, match=r"mask must be \(1, 1, 4, 7\)"):
        padded_mask(torch.zeros(1, 1, 4, 6), 3, 4, 9, 32)


@pytest.mark.parametrize("kwargs,message", [
    ({"cache_len": 1}, "cache_len must be >= 2"),
    ({"query_sizes": (9, 1)}, "increasing"),
    ({"query_sizes": (2, 9)}, "start at 1"),
    ({"cache_len": 16, "query_sizes": (1, 17)}, "exceeds cache_len"),
])
def test_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CompileConfig(**kwargs)


@pytest.mark.parametrize("size,padded", [(1, 1), (2, 9), (9, 9), (10, 17), (17, 17)])
def test_queries_pad_to_the_next_size(size, padded):
    assert CompileConfig(query_sizes=(1, 9, 17)).padded(size) == padded


def test_queries_beyond_the_largest_size_are_refused():
    with pytest.raises(ValueError, match="exceeds the largest compiled size 17"):
        CompileConfig(query_sizes=(1, 9, 17)).padded(18)


def _filled_caches(target, rows):
    """A dynamic and a static cache holding the same ``rows`` (distinct per layer and row)."""
    static = compile_target(target, CompileConfig(cache_len=32, query_sizes=(1,)))
    handle = static.new_cache()
    dynamic = DynamicCache(config=target.config)
    for i, layer in enumerate(static.engine.cache.layers):
        kv = torch.randn(1, target.config.num_key_value_heads, rows, 8, generator=torch.Generator().manual_seed(i))
        dynamic.update(kv, -kv, i)
        layer.lazy_initialization(kv, kv)
        layer.keys[..., :rows, :], layer.values[..., :rows, :] = kv, -kv
    handle.length = rows
    return static, handle, dynamic


@pytest.mark.parametrize("path", [[0], [0, 1, 2], [0, 2, 5], [0, 3], [0, 4, 5, 6]])
def test_static_compaction_equals_keep_path_on_a_dynamic_cache(path):
    target = Target(tiny_model("llama", 16), ByteTokenizer(), "tiny")
    static, handle, dynamic = _filled_caches(target, 10)
    keep_path(dynamic, 3, path)
    keep_path(handle, 3, path)  # dispatches to StaticKV.keep_path
    assert handle.get_seq_length() == dynamic.get_seq_length() == 3 + len(path)
    for mine, theirs in zip(static.engine.cache.layers, dynamic.layers):
        n = handle.length
        assert torch.equal(mine.keys[..., :n, :], theirs.keys) and torch.equal(mine.values[..., :n, :], theirs.values)


def test_an_old_cache_handle_is_refused():
    target = compile_target(Target(tiny_model("llama", 16), ByteTokenizer(), "tiny"),
                            CompileConfig(cache_len=32, query_sizes=(1,)))
    old = target.new_cache()
    target.new_cache()
    with pytest.raises(ValueError, match="replaced by a later target.new_cache"):
        target.forward(torch.tensor([1, 2]), old)
    with pytest.raises(ValueError, match="its own cache"):
        target.forward(torch.tensor([1, 2]), DynamicCache(config=target.config))
    with pytest.raises(ValueError, match="already"):
        compile_target(target)
    assert isinstance(target.new_cache(), StaticKV) and target.max_context == 32


@pytest.fixture(scope="module")
def head_proposers(compiled):
    """Eager head proposers over one random 1-layer head (one tap): the compiled target compiles
    their draft pass, one graph per context bucket for the one head."""
    from jetflow.training.train import build_head
    from jetflow.training.config import TrainConfig
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    head = build_head(TrainConfig(block_size=6, num_layers=1, init="random"), compiled, rows).eval()
    jetflow = HeadProposer(head, compiled, "accum_logp", width=3)
    return {"jetflow": jetflow, "dflash-chain": HeadProposer(head, compiled, "chain"),
            "jetflow+lookup": LookupMerged(jetflow)}


@pytest.mark.parametrize("n_ctx", [5, 64])  # padded to the 64 bucket, and filling it exactly
def test_compiled_draft_pass_equals_the_eager_one(compiled, head_proposers, n_ctx):
    eager = head_proposers["jetflow"]
    twin = compiled.draft_proposer(eager)
    assert isinstance(twin, CompiledHeadProposer) and compiled.draft_proposer(eager) is twin
    assert compiled.draft_proposer(head_proposers["dflash-chain"]).draft is twin.draft  # one head, one draft
    taps = torch.randn(n_ctx, len(eager.taps), compiled.config.hidden_size, generator=torch.Generator().manual_seed(n_ctx))
    state = eager.head.extend(None, taps)
    hidden = eager.head.draft_block(state, 401, eager.embed)
    want = eager.logp(hidden)
    got_hidden, got = twin.draft(state, 401, eager.embed)
    assert got.shape == want.shape == (eager.head.config.block_size - 1, compiled.config.vocab_size)
    torch.testing.assert_close(got_hidden, hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    hidden = twin.depth_hidden(eager.start(None), [401], taps[-1:])
    assert twin.logp(hidden) is twin._last[1]  # the graph's own
    assert twin.logp(hidden[:2]).data_ptr() == twin._last[1].data_ptr()  # a small budget's depths: its first rows
    assert torch.equal(got.argmax(-1), want.argmax(-1))
    assert set(twin.draft.compile_s) == {64}


def test_only_head_proposers_get_a_compiled_draft(compiled, head_proposers):
    merged = compiled.draft_proposer(head_proposers["jetflow+lookup"])
    assert isinstance(merged, LookupMerged) and isinstance(merged.inner, CompiledHeadProposer)
    assert compiled.draft_proposer(merged.inner) is merged.inner  # a twin has no twin of its own
    lookup = LookupProposer()
    assert compiled.draft_proposer(lookup) is lookup and compiled.draft_proposer(None) is None
    off = compile_target(Target(tiny_model("llama", 16), ByteTokenizer(), "tiny"),
                         CompileConfig(cache_len=32, query_sizes=(1,), compile_head=False))
    assert off.draft_proposer(head_proposers["jetflow"]) is head_proposers["jetflow"]


def test_head_context_buckets():
    cfg = CompileConfig(cache_len=300, query_sizes=(1,))
    assert cfg.head_contexts == (64, 128, 256, 300)
    assert [cfg.context(n) for n in (1, 64, 65, 257, 300)] == [64, 64, 128, 300, 300]
    with pytest.raises(ValueError, match="a head context of 301 rows exceeds the largest compiled size 300"):
        cfg.context(301)
    with pytest.raises(ValueError, match="head_contexts must be increasing"):
        CompileConfig(head_contexts=(128, 64))


def test_compiled_and_eager_give_the_same_greedy_tokens(eager_target, compiled, head_proposers):
    for ids in PROMPTS:
        ref = hf_greedy(eager_target, ids, NEW)
        assert generate(compiled, torch.tensor(ids), None, max_new_tokens=NEW).tokens == ref
        v = eager_target.config.vocab_size
        stubs = {"random": RandomProposer(v, width=3), "oracle": OracleProposer(ref, v),
                 "oracle-wrong-at-3": OracleProposer(ref, v, wrong_at=3, siblings=2), "lookup": LookupProposer()}
        for name, proposer in {**stubs, **head_proposers}.items():
            for budget in (1, 8):
                res = generate(compiled, torch.tensor(ids), proposer, budget=budget, max_new_tokens=NEW)
                assert res.tokens == ref, (name, budget)
    assert set(compiled.engine.compile_s) == set(SIZES)  # every decode forward ran a compiled graph
    draft = compiled.draft_proposer(head_proposers["jetflow"]).draft
    assert set(draft.compile_s) == {64} and list(compiled.engine.drafts.values()) == [draft]  # every draft too


def test_compiled_taps_equal_eager_taps(eager_target, compiled):
    ids, taps = torch.tensor(PROMPTS[0]), (0, 1)
    eager_cache, cache = eager_target.new_cache(), compiled.new_cache()
    for target, c in ((eager_target, eager_cache), (compiled, cache)):
        target.forward(ids, c)
    tree = TREES[2]
    mask = tree_attention_mask(tree, len(ids))
    want = eager_target.forward(tree.tokens, eager_cache, positions=tree.depth + len(ids), mask=mask, taps=taps)
    got = compiled.forward(tree.tokens, cache, positions=tree.depth + len(ids), mask=mask, taps=taps)
    assert got.taps.shape == want.taps.shape == (len(tree), 2, eager_target.config.hidden_size)
    torch.testing.assert_close(got.taps, want.taps, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got.logits, want.logits, rtol=1e-4, atol=1e-4)


def test_compiled_sampling_matches_target_distribution(small_vocab_target):
    """The eager distribution test (chi-square over every 3-token continuation) on the compiled path."""
    target = compile_target(small_vocab_target, CompileConfig(cache_len=32, query_sizes=(1, 13)))
    eager_distribution_test(target, 1.0)
    assert set(target.engine.compile_s) == {1, 13}  # generate's warmup compiles both; every tree ran the 13 graph


@pytest.mark.parametrize("argv", [["generate", "--prompt", "hi"], ["bench"]])
def test_every_decoding_command_takes_compile(argv):
    from jetflow.cli import build_parser
    parser = build_parser()
    assert parser.parse_args(argv + ["--compile"]).compile and not parser.parse_args(argv).compile


def test_speed_draft_rows_time_and_compare_both_passes(eager_target, compiled, head_proposers):
    from jetflow.results.speed import SpeedConfig, _context_state, draft_rows, warm_drafts
    cfg = SpeedConfig(past_len=10, draft_repeats=2)
    props = {"jetflow+lookup": head_proposers["jetflow+lookup"], "lookup": LookupProposer()}
    state = _context_state(eager_target, cfg)
    warm_drafts(compiled, props, state)  # a compile row unless an earlier test compiled this head's graph
    assert warm_drafts(compiled, props, state) == []  # compiled now: no second compile row
    rows = draft_rows(compiled, props, state, cfg)
    assert [(r["method"], r["path"]) for r in rows] == [("jetflow+lookup", "eager"), ("jetflow+lookup", "compiled")]
    assert all(r["context"] == 10 and r["seconds"] > 0 and r["argmax_differs"] == 0 for r in rows)
    assert rows[0]["max_abs_diff"] < 1e-3


def test_nothing_compiles_after_warmup(compiled, head_proposers):
    """``warm`` compiles every query size and every head bucket up front; a decode crossing from the 64 bucket
    into the 128 one afterwards compiles nothing (no new graph, no dynamo frame) and reports no compile time."""
    from torch._dynamo.utils import counters
    rows = compiled.warm(head_proposers.values())
    assert compiled.warm(head_proposers.values()) == []  # warm already: nothing to do
    assert {("target", s) for s in SIZES} | {("draft", 64), ("draft", 128)} \
        == {(key[0], key[-1]) for key in compiled.compiled_graphs()}
    assert all(r["seconds"] > 0 for r in rows)
    before, graphs = dict(counters["stats"]), compiled.compiled_graphs()
    ids = torch.tensor(PROMPTS[0] * (80 // len(PROMPTS[0]) + 1))[:80]  # 80 rows of context: the 128 bucket
    for proposer in [None, *head_proposers.values()]:
        res = generate(compiled, ids, proposer, budget=8, max_new_tokens=12)
        assert res.compile_s == 0.0 and res.new_tokens >= 1
    assert compiled.compiled_graphs() == graphs
    assert dict(counters["stats"]) == before, "a decode after warmup compiled a graph"


def test_generate_warms_before_its_clock():
    """On a cold compiled target ``generate`` pays the compile before timing and reports it apart."""
    target = compile_target(Target(tiny_model("llama", 16, layers=1), ByteTokenizer(), "tiny"),
                            CompileConfig(cache_len=32, query_sizes=(1,)))
    res = generate(target, torch.tensor([3, 4, 5]), None, max_new_tokens=4)
    assert res.compile_s > 0 and res.compile_s == sum(target.engine.compile_s.values())
    assert generate(target, torch.tensor([3, 4, 5]), None, max_new_tokens=4).compile_s == 0.0
