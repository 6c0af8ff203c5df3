"""Replay: walked rounds against hand-made drafts, and against real decoding on a tiny target."""
import pytest
import torch

from fakes import random_profile
from jetflow.evaluation import replay as rp
from jetflow.engine.decode import generate
from jetflow.drafting.proposers import HeadProposer, LookupMerged
from jetflow.training.train import build_head
from jetflow.training.config import TrainConfig

EOS = {2}
D, K = 4, 3


def table_with(tokens, rank: int) -> rp.DraftTable:
    """Drafts whose rank-``rank`` token at every depth is the true continuation (the others are decoys)."""
    a = len(tokens) - 1
    ids = torch.empty(a, D, K, dtype=torch.long)
    for i in range(a):
        for d in range(1, D + 1):
            truth = tokens[i + d] if i + d < len(tokens) else 3
            decoys = iter(t for t in (7, 8, 9, 10) if t != truth)
            ids[i, d - 1] = torch.tensor([truth if r == rank else next(decoys) for r in range(K)])
    logp = torch.tensor([-0.1, -1.0, -3.0]).expand(a, D, K).clone()
    return rp.DraftTable(logp, ids)


def trace_of(tokens) -> rp.Trace:
    return rp.Trace("toy", "0", [1, 5], list(tokens), len(tokens))


TOKENS = list(range(100, 123)) + [2]  # 24 tokens ending in EOS


def committed(rounds):
    return [t for r in rounds for t in r.committed]


@pytest.mark.parametrize("builder", ["chain", "accum_logp", "best_prefix"])
def test_rank0_drafts_commit_whole_chains(builder):
    rounds = rp.walk(table_with(TOKENS, 0), trace_of(TOKENS), rp.tree_builder(builder, width=3), 12, EOS)
    assert committed(rounds) == TOKENS[1:]                      # the walk rebuilds the answer
    assert [len(r.committed) for r in rounds] == [D + 1] * 4 + [3]  # 4 full rounds, then 3 up to EOS


def test_rank1_drafts_need_a_tree():
    chain = rp.walk(table_with(TOKENS, 1), trace_of(TOKENS), rp.tree_builder("chain"), D, EOS)
    assert all(len(r.committed) == 1 for r in chain)            # the argmax chain never matches
    narrow = rp.walk(table_with(TOKENS, 1), trace_of(TOKENS), rp.tree_builder("accum_logp", width=1), 12, EOS)
    assert all(len(r.committed) == 1 for r in narrow)
    wide = rp.walk(table_with(TOKENS, 1), trace_of(TOKENS), rp.tree_builder("accum_logp", width=2), 30, EOS)
    assert committed(wide) == TOKENS[1:] and len(wide[0].committed) == D + 1


def test_walk_stops_at_max_new_tokens_without_eos():
    tokens = list(range(100, 110))                              # cut by max_new_tokens, no EOS
    rounds = rp.walk(table_with(tokens, 0), trace_of(tokens), rp.tree_builder("chain"), D, EOS)
    assert committed(rounds) == tokens[1:] and [len(r.committed) for r in rounds] == [5, 4]


@pytest.mark.parametrize("merged", [False, True])
@pytest.mark.parametrize("builder", ["accum_logp", "best_prefix", "chain", "top2gap", "calibrated_prefix",
                                     "profile_prefix"])
def test_replayed_rounds_equal_decoded_rounds(tiny_target, builder, merged):
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    head = build_head(TrainConfig(block_size=6, draft_vocab=300), tiny_target, rows).eval()
    proposer = HeadProposer(head, tiny_target, builder, width=3, profile=random_profile(5, 8))
    lookup, changed = LookupMerged(proposer) if merged else None, []
    prompts = [{"id": "a", "prompt": "Count to five."}, {"id": "b", "prompt": "Name a colour."},
               {"id": "c", "prompt": "one two one two one two one two one two"}]  # its answer repeats a token
    traces = rp.ar_traces(tiny_target, prompts, 20, progress=False)
    for trace in traces:
        table = rp.draft_table(proposer, trace, k=16)
        for budget in (4, 12):
            real = generate(tiny_target, torch.tensor(trace.prompt_ids), lookup or proposer, budget=budget,
                            max_new_tokens=20).rounds
            walked = rp.walk(table, trace, rp.tree_builder(builder, width=3, profile=proposer.profile), budget,
                             tiny_target.eos_ids, lookup)
            assert [r.tree.tokens.tolist() for r in walked] == [r.tree.tokens.tolist() for r in real]
            assert [r.committed for r in walked] == [r.committed for r in real]
            if merged:  # the lookup branches did change some trees
                plain = rp.walk(table, trace, rp.tree_builder(builder, width=3, profile=proposer.profile), budget,
                                tiny_target.eos_ids)
                changed.append(any(a.tree.tokens.tolist() != b.tree.tokens.tolist() for a, b in zip(plain, walked)))
    assert any(changed) or not merged


def test_ar_traces_resume_from_the_cache(tiny_target, tmp_path, monkeypatch):
    prompts = [{"id": "a", "prompt": "Count to five."}, {"id": "b", "prompt": "Name a colour."}]
    cache = tmp_path / "ar.jsonl"
    first = rp.ar_traces(tiny_target, prompts[:1], 8, dataset="toy", cache=cache, progress=False)
    calls = []
    real_generate = rp.generate
    monkeypatch.setattr(rp, "generate", lambda *a, **k: calls.append(1) or real_generate(*a, **k))
    both = rp.ar_traces(tiny_target, prompts, 8, dataset="toy", cache=cache, progress=False)
    assert len(calls) == 1 and both[0] == first[0]              # only prompt "b" was decoded
    assert len(cache.read_text().splitlines()) == 2
    again = rp.ar_traces(tiny_target, prompts, 12, dataset="toy", cache=cache, progress=False)
    assert len(calls) == 3 and all(len(t.tokens) <= 12 for t in again)  # another length: decoded anew


def test_replay_rejects_bad_input(tiny_target):
    with pytest.raises(ValueError, match="unknown head method"):
        rp.replay(tiny_target, ["lookup"], {}, [16])
    with pytest.raises(ValueError, match="budgets"):
        rp.replay(tiny_target, ["jetflow"], {}, [0])
    with pytest.raises(ValueError, match="widths"):
        rp.replay(tiny_target, ["jetflow"], {}, [16], widths=[0])


def test_markdown_has_a_column_per_budget():
    rows = [{"method": "jetflow", "width": 7, "dataset": "gsm8k", "budget": b, "tau": 2.0 + b / 100}
            for b in (16, 64)] + [{"method": "dflash", "width": None, "dataset": "gsm8k", "budget": 16, "tau": 1.9}]
    md = rp.to_markdown(rows)
    assert "| jetflow | 7 | gsm8k | 2.16 | 2.64 |" in md and "| dflash | - | gsm8k | 1.90 | - |" in md
    assert "bonus" in md
