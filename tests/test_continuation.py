"""Tests for jetflow/engine/continuation.py and its columns: continuation after an accepted sibling, counted
on hand-made trees (nothing decoded)."""
import pytest

from jetflow.engine import metrics
from jetflow.engine.continuation import Continuation, continuation_counts, first_children
from jetflow.engine.decode import Round
from jetflow.engine.metrics import PromptRun, RoundStat
from jetflow.engine.tree import Tree

# root 5; depth 1: node 1 (10, best) and node 2 (11); under 1: nodes 3 (20, best), 4 (21);
# under 2: nodes 5 (30, best) and 6 (31)
TREE = Tree.from_lists([5, 10, 11, 20, 21, 30, 31], [-1, 0, 0, 1, 1, 2, 2],
                       score=[0.0, -0.1, -1.0, -0.3, -2.0, -1.2, -1.5])


def rnd(path, committed, tree=TREE):
    return Round(tree, path, committed, [0] * len(tree), 0.0, 0.0)


def test_first_child_is_the_best_scored_not_the_first_inserted():
    tree = Tree.from_lists([5, 10, 11, 12], [-1, 0, 0, 1], score=[0.0, -2.0, -0.5, -2.5])
    assert first_children(tree.parents, tree.score) == [2, 3, -1, -1]
    assert first_children(TREE.parents, TREE.score) == [1, 3, 5, -1, -1, -1, -1]


@pytest.mark.parametrize("path, committed, expected", [
    ([0, 2, 5], [11, 30, 40], Continuation(1, 1, 0, 0, True)),   # sibling 2 accepted, its first child next
    ([0, 2], [11, 99], Continuation(0, 1, 0, 0, True)),          # sibling 2 accepted, the target went elsewhere
    ([0, 1, 3], [10, 20, 7], Continuation(0, 0, 1, 1, True)),    # spine: node 1 then its first child 3
    ([0, 1, 4], [10, 21, 8], Continuation(0, 0, 0, 1, True)),    # spine node 1, but the target took node 4 (a leaf)
    ([0], [12], Continuation(0, 0, 0, 0, True)),                 # nothing accepted: no chance
])
def test_counts_per_round(path, committed, expected):
    assert continuation_counts(TREE, path, committed) == expected


def test_a_truncated_round_falls_back_to_the_targets_choice_or_skips():
    choice = [0, 20, 0, 0, 0, 0, 0]
    assert continuation_counts(TREE, [0, 1], [10], choice) == Continuation(0, 0, 1, 1, True)
    assert continuation_counts(TREE, [0, 1], [10]) == Continuation(0, 0, 0, 0, True)


def test_rates_over_rounds_and_a_chain_reports_none_not_zero():
    rounds = [rnd([0, 2, 5], [11, 30, 40]), rnd([0, 2], [11, 99]), rnd([0, 1, 3], [10, 20, 7]),
              rnd([0, 1, 4], [10, 21, 8])]
    stats = metrics.round_stats(rounds)
    assert (stats["sibling_continuation"], stats["sibling_n"]) == (0.5, 2)
    assert (stats["spine_continuation"], stats["spine_n"]) == (0.5, 2)
    chain = Tree.from_lists([5, 6, 7], [-1, 0, 1])
    stats = metrics.round_stats([rnd([0, 1], [6, 7], chain), rnd([0], [9], chain)])
    assert [stats[k] for k in ("sibling_continuation", "sibling_n", "spine_continuation", "spine_n")] == [None] * 4
    # a tree that branches but whose accepted nodes were all first children: sibling has no value, spine has one
    stats = metrics.round_stats([rnd([0, 1, 3], [10, 20, 7])])
    assert stats["sibling_continuation"] is None and stats["sibling_n"] == 0 and stats["spine_continuation"] == 1.0


def test_journalled_rounds_keep_the_counts_and_old_journals_still_load():
    run = PromptRun([10, 20, 7], 3, 1.0, 0.1, [RoundStat.of(rnd([0, 2, 5], [11, 30, 40]))])
    back = PromptRun.from_json(run.to_json())
    assert back.rounds == run.rounds and back.rounds[0].continuation == Continuation(1, 1, 0, 0, True)
    old = PromptRun.from_json({**run.to_json(), "rounds": [[3, 2, 7, 2, 3]]})  # five fields, before continuation
    assert metrics.continuation(old.rounds)["sibling_continuation"] is None


def test_tables_show_continuation_with_counts_and_a_dash_for_chains():
    from jetflow.evaluation.rows import bench_markdown, continuation_summary, replay_markdown
    setup = {"dtype": "float32", "device": "cpu", "hardware": "x", "torch": "t", "transformers": "t"}
    tree_row = {"method": "ddtree", "dataset": "gsm8k", "budget": 16, "width": None, "n_prompts": 2, "new_tokens": 9,
                "tau": 2.5, "verify_tokens": 17.0, "prefill_s": 0.1, "decode_s": 1.0, "tokens_per_s": 9.0,
                "speedup": 1.5, "identical_to_ar": 2, "sibling_continuation": 0.25, "sibling_n": 8,
                "spine_continuation": 0.75, "spine_n": 40, **setup}
    chain_row = {**tree_row, "method": "dflash", "sibling_continuation": None, "sibling_n": None,
                 "spine_continuation": None, "spine_n": None}
    bench = bench_markdown([tree_row, chain_row])
    assert "| sibling cont. | spine cont. |" in bench
    assert "| 2.50 | 0.25 (8) | 0.75 (40) |" in bench and "| 2.50 | - | - |" in bench
    replay = replay_markdown([tree_row, chain_row])
    assert "| ddtree | - | gsm8k | 16 | 2.50 | 0.25 (8) | 0.75 (40) |" in replay
    assert "sibling cont." not in replay_markdown([{k: v for k, v in tree_row.items() if "_n" not in k
                                                   and "continuation" not in k}])
    summary = continuation_summary({"tree": [rnd([0, 2, 5], [11, 30, 40])]})
    assert summary == [{"method": "tree", "tau": 3.0, "sibling_continuation": 1.0, "sibling_n": 1,
                        "spine_continuation": None, "spine_n": 0}]


def test_the_bonus_can_be_the_judged_nodes_first_child():
    # node 2 (a sibling) accepted last, the bonus after it 30, node 2's first child: a hit. The engine's walks
    # would have followed that child (greedy and sample-and-match both take a child whose token the target
    # picks); the counts judge the bonus like any committed token and do not rely on the walk
    assert continuation_counts(TREE, [0, 2], [11, 30]) == Continuation(1, 1, 0, 0, True)
    # the bonus is node 2's second child 31: a miss; a tie in score goes to the earlier child
    assert continuation_counts(TREE, [0, 2], [11, 31]) == Continuation(0, 1, 0, 0, True)
    tied = Tree.from_lists([5, 10, 11, 20], [-1, 0, 0, 1], score=[0.0, -1.0, -1.0, -1.5])
    assert continuation_counts(tied, [0, 1], [10, 20]) == Continuation(0, 0, 1, 1, True)
    assert continuation_counts(tied, [0, 2], [11, 20]) == Continuation(0, 0, 0, 0, True)  # node 2 is a leaf


def test_held_out_margins_against_ddtree():
    from jetflow.results import sibling
    row = {"dataset": "gsm8k", "budget": 16}
    rows = [{**row, "method": "ddtree", "tau": 2.0, "sibling_continuation": 0.2},
            {**row, "method": "jetflow-pc", "tau": 2.2, "sibling_continuation": 0.25},
            {**row, "method": "dflash", "tau": 1.5, "sibling_continuation": None},
            *({**r, "budget": 64, "tau": r["tau"] * 1.05} for r in
              [{"method": "ddtree", "tau": 2.0, "sibling_continuation": 0.2, "dataset": "gsm8k"},
               {"method": "jetflow-pc", "tau": 2.2, "sibling_continuation": 0.4, "dataset": "gsm8k"},
               {"method": "dflash", "tau": 1.5, "sibling_continuation": None, "dataset": "gsm8k"}])]
    got = sibling.cells(rows)
    assert [(c["budget"], round(c["ratio"], 3), c["ratio_ok"], round(c["gap"], 2), c["gap_ok"]) for c in got] == [
        (16, 1.1, True, 0.05, False), (64, 1.1, True, 0.2, True)]
    head, body = sibling.margins({"h": rows})
    assert len(head) == len(body[0]) == 9
    assert body[0] == ["h", "math (gsm8k)", "16", "2.00", "2.20", "1.100x yes", "0.20", "0.25", "+0.05 **no**"]
    head, body = sibling.headline([("dflash", "dflash", rows), ("ddtree", "ddtree", rows)])
    assert head[1:] == ["math B=16", "math B=64"]
    assert body == [["dflash", "1.50 / -", "1.58 / -"], ["ddtree", "2.00 / 0.20", "2.10 / 0.20"]]


def test_decoded_rounds_carry_the_counts(small_vocab_target):
    """Decoded on a 6-token target: the oracle's truth is every node's first child (its siblings tie and come later),
    so no sibling is ever accepted and every judged spine node continues, until the depth-3 token is made wrong."""
    import torch
    from jetflow.drafting.proposers import OracleProposer
    from jetflow.engine.decode import generate
    target = small_vocab_target
    ids = [1, 4, 3, 0]
    ar = generate(target, torch.tensor(ids), None, max_new_tokens=16).tokens
    v = target.config.vocab_size

    def stats(**kw):
        res = generate(target, torch.tensor(ids), OracleProposer(ar, v, **kw), budget=12, max_new_tokens=16)
        assert res.tokens == ar
        return metrics.round_stats(res.rounds)
    chain = stats()
    assert [chain[k] for k in ("sibling_continuation", "sibling_n", "spine_continuation", "spine_n")] == [None] * 4
    bushy = stats(siblings=2)
    assert (bushy["sibling_continuation"], bushy["sibling_n"], bushy["spine_continuation"]) == (None, 0, 1.0)
    assert bushy["spine_n"] > 0
    wrong = stats(siblings=2, wrong_at=3)   # per round: depth 1 continues to depth 2, depth 2's first child is wrong
    assert (wrong["sibling_continuation"], wrong["sibling_n"], wrong["spine_continuation"]) == (None, 0, 0.5)
