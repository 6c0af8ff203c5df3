"""Tests for jetflow/drafting/builders.py: the tree builders against loop and brute-force references."""
import itertools
import math

import pytest
import torch

from fakes import random_profile

from jetflow.drafting.builders import (BUILDERS, accum_logp, best_prefix, calibrated_prefix, chain, profile_caps,
                                       profile_prefix, top2gap, tree_builder)


def ref_accum_logp(logp, budget, width):
    """Algorithm 1 by linear scan: expand the best unexpanded node (earliest on ties)."""
    top = [sorted(range(logp.shape[1]), key=lambda v: (-logp[d, v].item(), v))[:width] for d in range(logp.shape[0])]
    nodes = [(0, 0.0, -1, None)]  # depth, score, parent, token
    frontier = [0]
    while frontier and len(nodes) - 1 < budget:
        best = max(frontier, key=lambda i: (nodes[i][1], -frontier.index(i)))
        frontier.remove(best)
        d = nodes[best][0]
        if d >= logp.shape[0]:
            continue
        for tok in top[d]:
            if len(nodes) - 1 >= budget:
                break
            nodes.append((d + 1, nodes[best][1] + logp[d, tok].item(), best, tok))
            frontier.append(len(nodes) - 1)
    return nodes


def random_logp(depths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(depths, vocab, generator=g) * 2, -1)


@pytest.mark.parametrize("seed,budget,width", [(0, 5, 2), (1, 16, 3), (2, 40, 7), (3, 64, 4)])
def test_accum_logp_matches_reference(seed, budget, width):
    logp = random_logp(6, 30, seed)
    tree = accum_logp(logp, budget, root=1, width=width)
    ref = ref_accum_logp(logp, budget, width)
    assert tree.parents.tolist() == [p for _, _, p, _ in ref]
    assert tree.tokens.tolist()[1:] == [t for *_, t in ref[1:]]
    assert torch.allclose(tree.score, torch.tensor([s for _, s, _, _ in ref]), atol=1e-5)
    assert tree.budget == min(budget, sum(width ** d for d in range(1, 7)))


@pytest.mark.parametrize("seed,budget", [(0, 1), (1, 7), (2, 20), (3, 60)])
def test_best_prefix_is_exact_top_b(seed, budget):
    depths, vocab = 3, 5
    logp = random_logp(depths, vocab, seed)
    tree = best_prefix(logp, budget, root=0)
    # brute force: every prefix of length 1..depths, scored by the sum of per-depth log-probs
    scores = sorted((sum(logp[d, t].item() for d, t in enumerate(seq)) for L in range(1, depths + 1)
                     for seq in itertools.product(range(vocab), repeat=L)), reverse=True)
    assert tree.budget == budget
    assert sorted(tree.score[1:].tolist(), reverse=True) == pytest.approx(scores[:budget], abs=1e-5)
    # it is a tree of prefixes: each node's score = parent's score + its own depth log-prob
    for i in range(1, len(tree)):
        p, d = tree.parents[i].item(), tree.depth[i].item()
        assert tree.score[i].item() == pytest.approx(tree.score[p].item() + logp[d - 1, tree.tokens[i]].item(), abs=1e-5)


def test_chain_is_argmax_per_depth():
    logp = random_logp(15, 50, 0)
    tree = chain(logp, budget=64, root=3)
    assert tree.budget == 15
    assert tree.tokens[1:].tolist() == logp.argmax(-1).tolist()
    assert tree.parents.tolist() == list(range(-1, 15))
    assert chain(logp, budget=4, root=3).budget == 4


@pytest.mark.parametrize("builder", [chain, accum_logp, best_prefix])
def test_parents_come_first_and_budget_checked(builder):
    tree = builder(random_logp(5, 20, 1), 12, root=0)
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()) if i)
    with pytest.raises(ValueError, match="budget must be >= 1, got 0"):
        builder(random_logp(5, 20, 1), 0, root=0)


# ---------------------------------------------------------------- builders beyond the paper
# Each is checked against brute force: every prefix (a sequence of ranks, one per depth) of a small
# (D, V) table, kept when the builder's caps allow it and scored by its own per-node gain; the tree
# must hold exactly the `budget` best scores, and each node's score must be its parent's plus its gain.


def ranked(logp):
    """(D, V) -> per depth the token ids and log-probs in descending order (ties: lower id first)."""
    order = [sorted(range(logp.shape[1]), key=lambda v: (-logp[d, v].item(), v)) for d in range(logp.shape[0])]
    return order, [[logp[d, v].item() for v in order[d]] for d in range(logp.shape[0])]


def brute_force_scores(depths, vocab, allowed, gain, budget):
    """The `budget` best scores over rank sequences r_1..r_L (L = 1..depths) that `allowed` keeps;
    gain(d, r, off) is a node's gain given whether some earlier rank was non-zero."""
    scores = []
    for length in range(1, depths + 1):
        for seq in itertools.product(range(vocab), repeat=length):
            if allowed(seq):
                scores.append(sum(gain(d + 1, r, any(x > 0 for x in seq[:d])) for d, r in enumerate(seq)))
    return sorted(scores, reverse=True)[:budget]


def node_ranks(tree, order):
    """Each node's rank sequence from the root (its tokens looked up in the depth's ranking)."""
    seqs = []
    for i in range(1, len(tree)):
        path = tree.path_to(i)[1:]
        seqs.append(tuple(order[tree.depth[j].item() - 1].index(tree.tokens[j].item()) for j in path))
    return seqs


def check_against_brute_force(tree, logp, budget, allowed, gain):
    order, _ = ranked(logp)
    depths, vocab = logp.shape
    want = brute_force_scores(depths, vocab, allowed, gain, budget)
    assert tree.budget == len(want)
    assert sorted(tree.score[1:].tolist(), reverse=True) == pytest.approx(want, abs=1e-5)
    for i, seq in enumerate(node_ranks(tree, order), start=1):
        assert allowed(seq)
        off = any(x > 0 for x in seq[:-1])
        parent = tree.parents[i].item()
        assert tree.score[i].item() == pytest.approx(tree.score[parent].item() + gain(len(seq), seq[-1], off), abs=1e-5)
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()) if i)


def ref_top2gap_caps(logp, width, beta=1.0, g0=1.0):
    _, lps = ranked(logp)
    return [max(1, round(width / (1 + math.exp(beta * ((row[0] - row[1]) - g0))))) for row in lps]


@pytest.mark.parametrize("seed,budget,width", [(0, 1, 3), (1, 8, 4), (2, 30, 5), (3, 200, 6), (4, 17, 2)])
def test_top2gap_is_best_prefix_under_gap_caps(seed, budget, width):
    logp = random_logp(3, 6, seed) * (0.3 + seed / 3)  # flatter and sharper rows: the caps differ per depth
    caps = ref_top2gap_caps(logp, width)
    _, lps = ranked(logp)
    tree = top2gap(logp, budget, root=9, width=width)
    check_against_brute_force(tree, logp, budget, lambda seq: all(r < min(caps[d], width) for d, r in enumerate(seq)),
                              lambda d, r, off: lps[d - 1][r])
    assert tree.tokens[0].item() == 9


def test_top2gap_cap_follows_the_gap():
    flat = torch.zeros(2, 10).log_softmax(-1)                    # gap 0: round(8 * sigmoid(1)) = 6 children
    sharp = torch.tensor([[0.0] + [-20.0] * 9] * 2).log_softmax(-1)  # gap 20: one child, a chain
    assert top2gap(flat, 50, root=0, width=8).children()[0].__len__() == 6
    assert top2gap(sharp, 50, root=0, width=8).parents.tolist() == [-1, 0, 1]


def ref_calibrated_gain(profile, lps):
    edges = profile.edges.tolist()

    def gain(d, r, off):
        lp = min(lps[d - 1][r], 0.0)
        b = max(i for i in range(len(edges) - 1) if lp >= edges[i] or i == 0)
        return math.log(max(profile.calibrated[int(off), min(d, profile.depths) - 1, b].item(), 1e-9))
    return gain


@pytest.mark.parametrize("seed,budget", [(0, 1), (1, 9), (2, 40), (3, 120)])
def test_calibrated_prefix_is_best_prefix_under_measured_acceptance(seed, budget):
    logp = random_logp(3, 5, seed)
    profile = random_profile(2, 4, seed)                         # fewer depths than logp: the last one repeats
    _, lps = ranked(logp)
    tree = calibrated_prefix(logp, budget, root=0, profile=profile)
    check_against_brute_force(tree, logp, budget, lambda seq: True, ref_calibrated_gain(profile, lps))


def ref_profile_caps(profile, budget, depths):
    """Caps by brute force: the budget best rank prefixes under the rank rates, then children counted."""
    n_rank = profile.rank.shape[-1]
    rate = lambda d, r, off: math.log(max(profile.rank[int(off), min(d, profile.depths) - 1, r].item(), 1e-9))
    seqs = [s for L in range(1, depths + 1) for s in itertools.product(range(n_rank), repeat=L)]
    score = {s: sum(rate(d + 1, r, any(x > 0 for x in s[:d])) for d, r in enumerate(s)) for s in seqs}
    best = sorted(seqs, key=lambda s: -score[s])[:budget]
    caps = torch.zeros(2, depths + 1, n_rank, dtype=torch.long)
    caps[0, :, 0] = 1
    for node in [()] + best:
        kids = sum(1 for s in best if s[:-1] == node)
        off, d, r = int(any(x > 0 for x in node[:-1])), len(node), node[-1] if node else 0
        caps[off, d, r] = max(int(caps[off, d, r]), kids)
    return caps


@pytest.mark.parametrize("seed,budget", [(0, 1), (1, 6), (2, 20), (3, 60)])
def test_profile_caps_and_prefix_match_brute_force(seed, budget):
    depths, n_rank = 3, 4
    profile = random_profile(depths, n_rank, seed)
    caps = profile_caps(profile, budget, depths)
    assert torch.equal(caps, ref_profile_caps(profile, budget, depths))
    logp = random_logp(depths, 6, seed)
    _, lps = ranked(logp)

    def allowed(seq):  # every node's rank below the cap of its parent's (depth, rank, spine state)
        for d, r in enumerate(seq):
            parent_rank = seq[d - 1] if d else 0
            off = int(any(x > 0 for x in seq[:d - 1])) if d else 0
            if r >= n_rank or r >= caps[off, d, parent_rank]:
                return False
        return True
    tree = profile_prefix(logp, budget, root=0, profile=profile)
    check_against_brute_force(tree, logp, budget, allowed, lambda d, r, off: lps[d - 1][r])


@pytest.mark.parametrize("builder", [calibrated_prefix, profile_prefix])
def test_profile_builders_need_a_profile(builder):
    with pytest.raises(ValueError, match="needs an acceptance profile"):
        builder(random_logp(3, 5, 0), 4, root=0)


@pytest.mark.parametrize("name", ["chain", "accum_logp", "best_prefix", "top2gap"])
def test_depths_past_the_budget_never_shape_a_tree(name):
    """A tree of ``budget`` drafts reaches no deeper than ``budget``: built from the first ``budget`` depths of the
    head's log-probs it is the tree built from all of them (``HeadProposer.propose`` scores only those)."""
    build = tree_builder(name, **({"width": 3} if "width" in BUILDERS[name].options else {}))
    for seed in range(3):
        logp = random_logp(8, 12, seed)
        for budget in (1, 2, 3, 5):
            whole, first = build(logp, budget, 0), build(logp[:budget], budget, 0)
            assert torch.equal(whole.tokens, first.tokens) and torch.equal(whole.parents, first.parents), budget
