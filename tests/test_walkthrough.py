"""Tests for jetflow/views/walkthrough.py: the toy table's trees worked by hand, the ✅/❌ rows of a hand
round, recomputed round logits against the decode loop's own choices, node info, and
sample-and-match's first token against the target's distribution."""
import pytest
import torch

from jetflow.views import walkthrough as wt
from jetflow.engine.decode import Round, generate
from jetflow.drafting.proposers import LookupProposer, RandomProposer
from jetflow.engine.tree import Tree, ancestor_mask
from jetflow.drafting.builders import accum_logp, best_prefix, chain

THE, CAT, A, SAT, DOG = 1, 2, 3, 4, 5


def test_toy_table_is_a_distribution_per_depth():
    logp = wt.toy_logp()
    assert logp.shape == (3, len(wt.TOY_WORDS))
    assert torch.allclose(logp.exp().sum(-1), torch.ones(3))
    assert wt.toy_decode([THE, CAT, SAT]) == "the cat sat"


# Worked by hand from TOY_PROBS (the notebook's exercise): Algorithm 1 at width 2 expands both children of
# a popped node at once, so "a" gets its child "cat" (0.35 x 0.5) before "the cat" gets "sat" (0.275 x 0.85);
# best_prefix places the 5 most probable prefixes; the chain is the argmax of every depth.
@pytest.mark.parametrize("build,tokens,parents", [
    (lambda l: accum_logp(l, 5, 0, width=2), [0, THE, A, CAT, DOG, CAT], [-1, 0, 0, 1, 1, 2]),
    (lambda l: best_prefix(l, 5, 0), [0, THE, A, CAT, SAT, DOG], [-1, 0, 0, 1, 3, 1]),
    (lambda l: chain(l, 5, 0), [0, THE, CAT, SAT], [-1, 0, 1, 2]),
])
def test_toy_trees_by_hand(build, tokens, parents):
    tree = build(wt.toy_logp())
    assert tree.tokens.tolist() == tokens and tree.parents.tolist() == parents


def hand_round():
    # root 10 -> 11 (accepted) -> 13 (rejected), 14 (rejected); root -> 12 (rejected)
    tree = Tree.from_lists([10, 11, 12, 13, 14], [-1, 0, 0, 1, 1])
    choice = [11, 15, 0, 0, 0]  # the target wants 11 after the root, 15 after node 1
    return Round(tree, [0, 1], [11, 15], choice, 0.0, 0.0)


def test_acceptance_rows_hand_round():
    rows = wt.acceptance_rows(hand_round(), decode=lambda ids: f"t{ids[0]}")
    assert [(r["depth"], r["node"], r["verdict"], r["target"]) for r in rows] == [
        (1, 1, "✅", "'t11'"), (1, 2, "❌", "'t11'"), (2, 3, "❌", "'t15'"), (2, 4, "❌", "'t15'"),
        (2, None, "⭐", "'t15'")]
    assert rows[2]["drafted"] == "'t13'"


def test_round_logits_reproduce_the_decode_loop(tiny_target):
    res = generate(tiny_target, torch.tensor([5, 17, 900, 33, 17, 900, 33, 17]), LookupProposer(), budget=6,
                   max_new_tokens=16)
    assert len(res.rounds) > 2
    for r, rnd in enumerate(res.rounds):
        logits = wt.round_logits(tiny_target, res, r)
        assert logits.shape == (len(rnd.tree), tiny_target.config.vocab_size)
        assert logits.argmax(-1).tolist() == rnd.target_choice
    with pytest.raises(IndexError, match="round_index"):
        wt.round_logits(tiny_target, res, len(res.rounds))


def test_node_info():
    tree = hand_round().tree
    logits = torch.full((5, 20), -10.0)
    logits[3, 7], logits[3, 8] = 5.0, 4.0
    info = wt.node_info(tree, logits, 3, decode=lambda ids: f"t{ids[0]}", top=2)
    assert info["path"] == [0, 1, 3] and info["path_text"] == ["'t10'", "'t11'", "'t13'"]
    assert [t for t, _ in info["top"]] == ["'t7'", "'t8'"]
    assert info["top"][0][1] == pytest.approx(torch.softmax(logits[3], -1)[7].item(), abs=1e-4)
    assert info["mask_row"] == ancestor_mask(tree.parents)[3].nonzero().flatten().tolist() == [0, 1, 3]
    with pytest.raises(IndexError):
        wt.node_info(tree, logits, 5)
    with pytest.raises(ValueError, match="rows"):
        wt.node_info(tree, logits[:3], 1)


def test_sample_match_first_token_follows_the_target(small_vocab_target):
    ids = torch.tensor([1, 2, 3])
    tree = RandomProposer(6, depths=3, width=3).propose(RandomProposer(6).start(ids), [1, 2, 3], None, 6)
    cache = small_vocab_target.new_cache()
    small_vocab_target.forward(ids[:-1], cache)
    from jetflow.engine.decode import verify_step
    _, step = verify_step(small_vocab_target, tree, cache, ())
    got = wt.sample_match(tree, step.logits, 1.0, 4000, seed=0)
    expected = torch.softmax(step.logits[0], -1)
    assert got["expected"] == pytest.approx(expected.tolist())
    assert sum(got["observed"]) == 4000 and got["tv"] < 0.05  # ~0.02 is the sampling noise at n = 4000
    freq = torch.tensor(got["observed"]) / 4000
    assert got["tv"] == pytest.approx(0.5 * (freq - expected).abs().sum().item())
    assert 0 <= got["accepted"] <= int(tree.depth.max())
    with pytest.raises(ValueError, match="n must be"):
        wt.sample_match(tree, step.logits, 1.0, 0)
