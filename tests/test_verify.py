import pytest
import torch

from jetflow.engine.tree import Tree
from jetflow.engine.verify import greedy_accept, kept_positions, sample_accept, tree_attention_mask

from test_tree import random_tree, ref_ancestors


def ref_greedy(tokens, parents, choice):
    """Longest accepted path by recursion over explicit root-to-node paths."""
    best = [0]
    for node in range(1, len(tokens)):
        path, j = [], node
        while j != -1:
            path.append(j)
            j = parents[j]
        path = path[::-1]
        ok = all(tokens[path[k + 1]] == choice[path[k]] for k in range(len(path) - 1))
        if ok and len(path) > len(best):
            best = path
    return best, choice[best[-1]]


@pytest.mark.parametrize("past", [0, 3])
def test_tree_mask_matches_loop_reference(past):
    tree = random_tree(9, 4)
    mask = tree_attention_mask(tree, past)
    assert mask.shape == (1, 1, 9, past + 9)
    allowed = mask[0, 0] == 0
    anc = ref_ancestors(tree.parents.tolist())
    for i in range(9):
        for j in range(past + 9):
            assert allowed[i, j] == (j < past or bool(anc[i, j - past]))


def test_greedy_accept_hand_worked():
    tree = Tree.from_lists([10, 11, 12, 13, 14], [-1, 0, 0, 1, 1])
    logits = torch.full((5, 20), -1.0)
    for node, tok in enumerate([12, 14, 0, 0, 5]):  # target's argmax at each node
        logits[node, tok] = 1.0
    path, bonus = greedy_accept(tree, logits)
    assert path == [0, 2] and bonus == 0  # 12 matches under the root, node 2 has no children


@pytest.mark.parametrize("seed", range(8))
def test_greedy_accept_matches_reference(seed):
    g = torch.Generator().manual_seed(seed)
    n = 15
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    tokens = [int(t) for t in torch.randint(0, 3, (n,), generator=g)]  # small vocab: many matches
    tree = Tree.from_lists(tokens, parents)
    logits = torch.randn(n, 3, generator=g)
    path, bonus = greedy_accept(tree, logits)
    ref_path, ref_bonus = ref_greedy(tokens, parents, logits.argmax(-1).tolist())
    assert len(path) == len(ref_path) and bonus == logits[path[-1]].argmax().item()
    assert [tokens[i] for i in path] == [tokens[i] for i in ref_path]


def test_sample_accept_follows_samples():
    tree = Tree.from_lists([0, 1, 2, 1], [-1, 0, 0, 1])
    logits = torch.full((4, 3), -1e9)
    logits[0, 1] = logits[1, 1] = logits[3, 2] = 0.0  # point masses
    logits[2, 0] = 0.0
    path, bonus = sample_accept(tree, logits, 1.0, torch.Generator().manual_seed(0))
    assert path == [0, 1, 3] and bonus == 2
    with pytest.raises(ValueError):
        sample_accept(tree, logits, 0.0)


def test_kept_positions():
    assert kept_positions(3, [0, 2, 5]).tolist() == [0, 1, 2, 3, 5, 8]


@pytest.mark.parametrize("path", [[0], [0, 1, 2], [0, 2, 5], [0, 3], []])
def test_keep_path_keeps_the_prefix_and_the_accepted_rows_in_order(path):
    from transformers import DynamicCache, LlamaConfig
    from jetflow.engine.target import keep_path
    cache = DynamicCache(config=LlamaConfig(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    rows = torch.arange(9, dtype=torch.float32)[None, None, :, None].expand(1, 1, 9, 2).contiguous()
    for i in range(2):
        cache.update(rows + 100 * i, -rows, i)
    keep_path(cache, 3, path)
    for i, layer in enumerate(cache.layers):
        want = kept_positions(3, path).float()
        assert torch.equal(layer.keys[0, 0, :, 0], want + 100 * i) and torch.equal(layer.values[0, 0, :, 1], -want)
    assert cache.get_seq_length() == 3 + len(path)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_mask_is_built_on_the_requested_device_in_the_targets_dtype(device, dtype):
    tree = random_tree(12, 5)
    mask = tree_attention_mask(tree, 4, dtype, device)
    assert mask.device.type == device and mask.dtype == dtype
    assert torch.equal(mask.cpu(), tree_attention_mask(tree, 4, dtype))
    assert torch.equal(mask.cpu() == 0, tree_attention_mask(tree, 4) == 0)
