import itertools

import pytest
import torch

from jetflow.tree import Tree, accum_logp, ancestor_mask, best_prefix, chain, merge, positions


def ref_ancestors(parents):
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j != -1:
            mask[i][j] = True
            j = parents[j]
    return torch.tensor(mask)


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


def random_tree(n, seed):
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return Tree.from_lists(list(range(100, 100 + n)), parents)


@pytest.mark.parametrize("seed", range(5))
def test_ancestor_mask_matches_loop_reference(seed):
    tree = random_tree(20, seed)
    assert torch.equal(ancestor_mask(tree.parents), ref_ancestors(tree.parents.tolist()))


def test_hand_worked_tree():
    #        0(root)
    #       /   \
    #      1     2
    #     / \
    #    3   4
    tree = Tree.from_lists([10, 11, 12, 13, 14], [-1, 0, 0, 1, 1])
    assert tree.depth.tolist() == [0, 1, 1, 2, 2]
    assert tree.budget == 4
    assert tree.children() == [[1, 2], [3, 4], [], [], []]
    assert tree.path_to(4) == [0, 1, 4]
    assert ancestor_mask(tree.parents)[4].tolist() == [True, True, False, False, True]
    assert positions(tree, 7).tolist() == [7, 8, 8, 9, 9]


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


def test_from_lists_rejects_bad_parents():
    with pytest.raises(ValueError):
        Tree.from_lists([1, 2, 3], [-1, 2, 0])


def test_merge_dedupes_shared_prefixes_and_caps_the_budget():
    first = Tree.from_lists([9, 5, 6, 7], [-1, 0, 1, 2])                  # a lookup chain 5 6 7
    second = Tree.from_lists([9, 5, 8, 6, 4], [-1, 0, 0, 1, 3], score=[0.0, -0.1, -0.5, -0.7, -1.0])
    tree = merge(first, second, budget=5)
    pairs = {(p, t) for t, p in zip(tree.tokens.tolist(), tree.parents.tolist())}
    assert tree.tokens.tolist() == [9, 5, 6, 7, 8, 4]       # 5 and 5->6 drafted by both count once
    assert tree.parents.tolist() == [-1, 0, 1, 2, 0, 2]     # second's 4 hangs under the shared 6
    assert len(pairs) == len(tree)
    # second's scores where it drafted the node, the parent's where only first did (7 under 6)
    assert tree.score.tolist() == pytest.approx([0.0, -0.1, -0.7, -0.7, -0.5, -1.0])
    capped = merge(first, second, budget=4)
    assert capped.tokens.tolist() == [9, 5, 6, 7, 8]         # first's nodes go in first, then second's best
    assert merge(first, second, budget=2).tokens.tolist() == [9, 5, 6]


def test_merge_keeps_every_path_of_both_trees_when_the_budget_allows():
    a, b = random_tree(12, 1), random_tree(15, 2)
    b = Tree.from_lists([100] + (b.tokens[1:] % 7 + 100).tolist(), b.parents.tolist())  # overlapping tokens
    a = Tree.from_lists([100] + (a.tokens[1:] % 7 + 100).tolist(), a.parents.tolist())
    tree = merge(a, b, budget=64)
    def prefixes(t):
        return {tuple(t.tokens[t.path_to(i)].tolist()) for i in range(len(t))}
    assert prefixes(tree) == prefixes(a) | prefixes(b)
    assert len(tree) == len(prefixes(tree))                 # one node per distinct prefix
    assert all(0 <= p < i for i, p in enumerate(tree.parents.tolist()) if i)
    assert tree.depth.tolist() == [len(tree.path_to(i)) - 1 for i in range(len(tree))]


def test_merge_rejects_bad_input():
    one = Tree.from_lists([1, 2], [-1, 0])
    with pytest.raises(ValueError, match="share the root"):
        merge(one, Tree.from_lists([3, 2], [-1, 0]), 4)
    with pytest.raises(ValueError, match="budget must be >= 1"):
        merge(one, one, 0)
