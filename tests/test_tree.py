"""Tests for jetflow/engine/tree.py: the typed Tree, its ancestor mask and positions, and merge."""
import pytest
import torch

from jetflow.engine.tree import Tree, ancestor_mask, merge, positions


def ref_ancestors(parents):
    n = len(parents)
    mask = [[False] * n for _ in range(n)]
    for i in range(n):
        j = i
        while j != -1:
            mask[i][j] = True
            j = parents[j]
    return torch.tensor(mask)


def random_tree(n, seed):
    g = torch.Generator().manual_seed(seed)
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    return Tree.from_lists(list(range(100, 100 + n)), parents)


@pytest.mark.parametrize("seed", range(5))
def test_ancestor_mask_matches_loop_reference(seed):
    tree = random_tree(20, seed)
    assert torch.equal(ancestor_mask(tree.parents), ref_ancestors(tree.parents.tolist()))


@pytest.mark.parametrize("n", [1, 2, 17, 64])
def test_ancestor_mask_of_a_chain_and_a_star(n):
    """The deepest tree (a chain: depth n-1) and the shallowest (a star: depth 1) against the loop reference."""
    chain_parents, star_parents = [-1] + list(range(n - 1)), [-1] + [0] * (n - 1)
    for parents in (chain_parents, star_parents):
        tree = Tree.from_lists(list(range(n)), parents)
        assert torch.equal(ancestor_mask(tree.parents), ref_ancestors(parents))
    assert torch.equal(ancestor_mask(torch.tensor(chain_parents)), torch.ones(n, n, dtype=torch.bool).tril())


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
