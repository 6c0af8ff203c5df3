"""The path correction (jetflow/drafting/correction.py), its training (jetflow/training/correction_train.py) and the
path_prefix builder: slow references, the zero correction, losslessness, replay == decode."""
import dataclasses
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

import jetflow.evaluation.replay as rp
from jetflow.drafting.correction import (PathCorrection, CorrectionConfig, candidates, corrected_logp, load_correction,
                                path_table, random_correction)
from jetflow.training.correction_train import (CorrectionTrainConfig, batch_logp, examples, fit, initial_module,
                                              sequence_features)
from jetflow.engine.decode import generate
from jetflow.drafting.proposers import HeadProposer, LookupMerged
from jetflow.drafting.methods import make_proposer
from jetflow.training.train import build_head
from jetflow.training.config import TrainConfig
from jetflow.drafting.builders import best_prefix, path_prefix, path_tail_prefix, tree_builder


def random_tables(depths, vocab, c, seed):
    g = torch.Generator().manual_seed(seed)
    logp = torch.log_softmax(torch.randn(depths, vocab, generator=g) * 2, -1)
    paths = torch.log_softmax(torch.randn(depths - 1, c, c + 2, generator=g) * 2, -1)[..., :c]  # rows sum < 1
    return logp, paths


def ref_path_prefix(logp, paths, budget):
    """Brute force: every path of candidates, scored by its corrected log-prob; the ``budget`` best."""
    depths, c = logp.shape[0], paths.shape[-1]
    top_lp, top_tok = logp.topk(c, -1)
    scored = {}
    for d in range(1, depths + 1):
        for cols in itertools.product(range(c), repeat=d):
            s = top_lp[0, cols[0]].item() + sum(paths[i - 1, cols[i - 1], cols[i]].item() for i in range(1, d))
            scored[tuple(top_tok[i, cols[i]].item() for i in range(d))] = s
    best = sorted(scored.items(), key=lambda kv: -kv[1])[:budget]
    return {path: pytest.approx(s, abs=1e-5) for path, s in best}


def ref_path_tail_prefix(logp, paths, budget):
    """Brute force for ``tail``: rows over the head's top-K (K = max(C, budget)); a candidate parent's row
    is its table row on the C candidates and the head's log-prob plus the leftover-mass ratio past them,
    any other parent's row (and depth 1's) the head's own."""
    depths, c = logp.shape[0], paths.shape[-1]
    k = max(c, min(budget, logp.shape[1]))
    top_lp, top_tok = logp.topk(k, -1)

    def lp(d, parent, j):  # log-prob of head rank j at depth d (1-based) under the depth-(d-1) rank ``parent``
        if d == 1 or parent >= c:
            return top_lp[d - 1, j].item()
        if j < c:
            return paths[d - 2, parent, j].item()
        left = math.log(1 - paths[d - 2, parent].exp().sum().item()) - math.log(1 - top_lp[d - 1, :c].exp().sum().item())
        return top_lp[d - 1, j].item() + left
    scored = {}
    for d in range(1, depths + 1):
        for cols in itertools.product(range(k), repeat=d):
            s = sum(lp(i + 1, cols[i - 1] if i else 0, cols[i]) for i in range(d))
            scored[tuple(top_tok[i, cols[i]].item() for i in range(d))] = s
    best = sorted(scored.items(), key=lambda kv: -kv[1])[:budget]
    return {path: pytest.approx(s, abs=1e-5) for path, s in best}


@pytest.mark.parametrize("depths,vocab,c", [(1, 5, 3), (3, 6, 3), (3, 7, 2)])
@pytest.mark.parametrize("budget", [1, 4, 11, 40])
@pytest.mark.parametrize("seed", [0, 1])
def test_path_tail_prefix_equals_brute_force(depths, vocab, c, budget, seed):
    logp, paths = random_tables(depths, vocab, c, seed)
    tree = path_tail_prefix(logp, budget, root=99, paths=paths)
    want = ref_path_tail_prefix(logp, paths, budget)
    assert tree.tokens[0] == 99 and tree.budget == len(want)
    assert tree_paths(tree) == want


def test_path_tail_prefix_under_a_zero_correction_is_best_prefix():
    """Rows that are the head's own on the candidates leave no mass to move: at every budget, DDTree's tree."""
    logp = torch.log_softmax(torch.randn(4, 9, generator=torch.Generator().manual_seed(4)) * 2, -1)
    top = logp.topk(3, -1).values
    paths = top[1:, None, :].expand(3, 3, 3).clone()
    for budget in (2, 5, 20, 60):
        a, b = path_tail_prefix(logp, budget, 5, paths=paths), best_prefix(logp, budget, 5)
        assert tree_paths(a) == pytest.approx(tree_paths(b), abs=1e-5)


def tree_paths(tree):
    tokens, score = tree.tokens.tolist(), tree.score.tolist()
    return {tuple(tokens[j] for j in tree.path_to(i)[1:]): score[i] for i in range(1, len(tree))}


@pytest.mark.parametrize("depths,vocab,c", [(1, 5, 3), (3, 6, 3), (4, 7, 2)])
@pytest.mark.parametrize("budget", [1, 4, 11, 40])
@pytest.mark.parametrize("seed", [0, 1])
def test_path_prefix_equals_brute_force(depths, vocab, c, budget, seed):
    logp, paths = random_tables(depths, vocab, c, seed)
    tree = path_prefix(logp, budget, root=99, paths=paths)
    want = ref_path_prefix(logp, paths, budget)
    assert tree.tokens[0] == 99 and tree.budget == len(want)
    assert tree_paths(tree) == want
    assert all(p < i for i, p in enumerate(tree.parents.tolist()) if i)


def test_path_prefix_uses_each_parents_own_row():
    logp = torch.log_softmax(torch.tensor([[2.0, 1.0, -9.0], [2.0, 1.0, -9.0]]), -1)
    paths = torch.log(torch.tensor([[[0.9, 0.05], [0.05, 0.9]]]))  # the second candidate prefers the second child
    tree = path_prefix(logp, 4, root=7, paths=paths)
    kids = {tree.tokens[i].item(): [tree.tokens[j].item() for j in ch] for i, ch in enumerate(tree.children())
            if tree.depth[i] == 1}
    assert kids == {0: [0], 1: [1]}


def test_path_prefix_needs_a_table():
    logp, paths = random_tables(3, 6, 3, 0)
    with pytest.raises(ValueError, match="train-correction"):
        path_prefix(logp, 4, 0)
    with pytest.raises(ValueError, match=r"\(D-1, C, C\)"):
        path_prefix(logp, 4, 0, paths=paths[:1])


def test_corrected_logp_equals_a_full_softmax():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 3
    cand_lp, cols = candidates(torch.log_softmax(logits, -1), 6)
    delta = torch.randn(4, 6, generator=g)
    full = logits.clone()
    for i in range(4):  # the slow reference: shift the candidates' logits, renormalise the whole row
        for j in range(6):
            full[i, cols[i, j]] += delta[i, j]
    want = torch.log_softmax(full, -1).gather(-1, cols)
    assert torch.allclose(corrected_logp(cand_lp, delta), want, atol=1e-5)
    assert torch.equal(corrected_logp(cand_lp, torch.zeros_like(delta)), cand_lp) or \
        torch.allclose(corrected_logp(cand_lp, torch.zeros_like(delta)), cand_lp, atol=1e-6)


def test_path_table_equals_a_loop_over_parents():
    h, c, v, depths = 8, 3, 20, 4
    g = torch.Generator().manual_seed(1)
    module = random_correction(h, c, seed=2)
    hidden, out, embed = (torch.randn(depths, h, generator=g), torch.randn(v, h, generator=g),
                          torch.randn(v, h, generator=g))
    logp = torch.log_softmax(hidden @ out.T, -1)
    lp, col = candidates(logp, c)
    table = path_table(module, hidden, lp, col, out[col], embed)
    assert table.shape == (depths - 1, c, c)
    for d in range(1, depths):
        for r in range(c):
            delta = module(hidden[d], embed[col[d - 1, r]])
            full = hidden[d] @ out.T
            full[col[d]] += out[col[d]] @ delta
            assert torch.allclose(table[d - 1, r], torch.log_softmax(full, -1)[col[d]], atol=1e-5)


def test_zero_correction_is_the_uncorrected_builder():
    """With ``up`` at zero (its initialisation) every parent's row is the head's, and path_prefix builds
    best_prefix's tree whenever the budget fits in the candidates."""
    h, c, v, depths = 8, 6, 30, 5
    g = torch.Generator().manual_seed(3)
    module = PathCorrection(CorrectionConfig(h, 4, c))
    assert not module.up.weight.any()
    hidden, out, embed = (torch.randn(depths, h, generator=g) * 3, torch.randn(v, h, generator=g),
                          torch.randn(v, h, generator=g))
    logp = torch.log_softmax(hidden @ out.T, -1)
    lp, col = candidates(logp, c)
    table = path_table(module, hidden, lp, col, out[col], embed)
    assert torch.allclose(table, lp[1:, None, :].expand_as(table), atol=1e-6)
    for budget in (1, 3, 6):
        a, b = path_prefix(logp, budget, 5, paths=table), best_prefix(logp, budget, 5)
        assert a.tokens.tolist() == b.tokens.tolist() and a.parents.tolist() == b.parents.tolist()


def tiny_head(target, draft_vocab=0, dtype=torch.float32):
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    return build_head(TrainConfig(block_size=6, draft_vocab=draft_vocab), target, rows).to(dtype).eval()


PROMPTS = [[5, 17, 300, 301, 302], [1, 9, 9, 9, 9, 9, 9, 9]]


@pytest.mark.parametrize("builder", ["path_prefix", "path_tail_prefix"])
@pytest.mark.parametrize("draft_vocab,dtype", [(0, torch.float32), (300, torch.bfloat16)])
def test_path_prefix_proposer_is_lossless(tiny_target, draft_vocab, dtype, builder):
    head = tiny_head(tiny_target, draft_vocab, dtype)
    proposer = HeadProposer(head, tiny_target, builder, correction=random_correction(head.config.hidden_size))
    for ids in PROMPTS:
        res = generate(tiny_target, torch.tensor(ids), proposer, budget=9, max_new_tokens=16)
        out = tiny_target.model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False)
        assert res.tokens == out[0, len(ids):].tolist()[:len(res.tokens)] and len(res.tokens) >= 1
    with pytest.raises(ValueError, match="train-correction"):
        generate(tiny_target, torch.tensor(PROMPTS[0]), HeadProposer(head, tiny_target, builder), budget=4)


def test_table_size_grows_with_the_budget():
    module = random_correction(8, candidates=64)
    assert [module.table_size(b) for b in (1, 16, 32, 40, 64, 255)] == [32, 32, 32, 40, 64, 64]
    assert module.table_size(None) == 64 and random_correction(8, candidates=8).table_size(255) == 8


@pytest.mark.parametrize("builder", ["path_prefix", "path_tail_prefix"])
@pytest.mark.parametrize("merged,c", [(False, 8), (True, 8), (False, 40)])
def test_replayed_rounds_equal_decoded_rounds(tiny_target, merged, c, builder):
    """With C = 40 the two budgets take tables of different sizes (C' = 32 and 40), in decode and replay."""
    head = tiny_head(tiny_target)
    proposer = HeadProposer(head, tiny_target, builder,
                            correction=random_correction(head.config.hidden_size, candidates=c))
    lookup = LookupMerged(proposer) if merged else None
    prompts = [{"id": "a", "prompt": "Count to five."}, {"id": "c", "prompt": "one two one two one two one two"}]
    budgets = (4, 40) if c > 32 else (4, 12)
    for trace in rp.ar_traces(tiny_target, prompts, 20, progress=False):
        table = rp.draft_table(proposer, trace, k=48, paths=budgets)
        sizes = sorted({proposer.correction.table_size(b) for b in budgets})
        assert {s: t.shape for s, t in table.paths.items()} == {s: (len(trace.tokens) - 1, 4, s, s) for s in sizes}
        for budget in budgets:
            real = generate(tiny_target, torch.tensor(trace.prompt_ids), lookup or proposer, budget=budget,
                            max_new_tokens=20).rounds
            walked = rp.walk(table, trace, tree_builder(builder), budget, tiny_target.eos_ids, lookup,
                             paths=proposer.correction.table_size(budget))
            assert [r.tree.tokens.tolist() for r in walked] == [r.tree.tokens.tolist() for r in real]
            assert [r.committed for r in walked] == [r.committed for r in real]


@pytest.mark.parametrize("extra", [{}, {"spine": True, "bigram_rank": 4}])
def test_training_matches_inference(tiny_target, extra):
    """``batch_logp`` (training) scores a candidate truth under its true parent as ``path_table``
    (inference) does, with the head's first choice and the bigram bias too (jetflow-pcs, jetflow-pcb)."""
    head = tiny_head(tiny_target, draft_vocab=300)  # 256 of 300 columns are candidates: most truths are
    extra = extra and {**extra, "vocab_size": tiny_target.config.vocab_size}
    proposer = HeadProposer(head, tiny_target, "path_prefix",
                            correction=random_correction(head.config.hidden_size, **extra))
    row = {"id": "a", "prompt_ids": [1, 5], "response_ids": list(range(400, 440))}
    feats = sequence_features(proposer, row, 30, 256, torch.Generator().manual_seed(0))
    ex = examples(feats, torch.ones(feats["truth"].shape[0], dtype=torch.bool))
    ex = ex[(feats["truth_pos"][ex[:, 0], ex[:, 1]] >= 0) & (feats["truth_pos"][ex[:, 0], ex[:, 1] - 1] >= 0)][:20]
    assert len(ex) > 0
    out, embed = proposer.out.float(), proposer.embed.float()
    with torch.no_grad():
        lp, truth = batch_logp(proposer.correction, feats, ex, out, embed, proposer.vocab)
    for (a, d), row_lp, t in zip(ex.tolist(), lp, truth.tolist()):
        col = feats["cand_col"][a].long()
        table = path_table(proposer.correction, feats["hidden"][a].float(), feats["cand_logp"][a], proposer.vocab[col],
                           out[col], embed)
        parent, pos = feats["truth_pos"][a, d - 1], feats["truth_pos"][a, d]
        assert torch.allclose(table[d - 1, parent], row_lp, atol=1e-4) and t == pytest.approx(row_lp[pos].item(), abs=1e-4)


def synthetic_features(n=600, depths=4, h=16, c=4, v=12, seed=0):
    """Anchors whose true token at depth d is the parent's column + 1 (mod C): a head that cannot know
    the parent gives every candidate the same probability, a path correction can learn it."""
    g = torch.Generator().manual_seed(seed)
    truth = torch.zeros(n, depths, dtype=torch.long)
    truth[:, 0] = torch.randint(0, c, (n,), generator=g)
    for d in range(1, depths):
        truth[:, d] = (truth[:, d - 1] + 1) % c
    feats = {"hidden": torch.randn(n, depths, h, generator=g).bfloat16(), "cand_logp": torch.full((n, depths, c), -1.6),
             "cand_col": torch.arange(c).int().expand(n, depths, c).clone(), "truth": truth,
             "truth_logp": torch.full((n, depths), -1.6), "truth_pos": truth.clone(),
             "heldout": torch.arange(n) % 5 == 0}
    return feats, torch.randn(v, h, generator=g), torch.randn(v, h, generator=g)


def test_fit_learns_a_parent_dependent_row(tmp_path):
    feats, out, embed = synthetic_features()
    cfg = CorrectionTrainConfig(rank=16, candidates=4, epochs=6, batch_size=64, lr=1e-2)
    _, history = fit(cfg, feats, out, embed, tmp_path / "c.pt", False)
    first, last = history[0], history[-1]
    assert last["loss"] < first["loss"] - 0.3 and last["off_corr_acc"] > 0.9 > first["off_corr_acc"]
    _, again = fit(cfg, feats, out, embed, tmp_path / "c.pt", False)  # resumes from the last epoch's checkpoint
    assert again == history


@pytest.mark.parametrize("init", ["head", "stack"])
def test_a_wider_correction_starts_as_the_one_it_grows_from(init):
    """init head/stack: the path correction's weights copied in, the spine input's columns and the bigram's v
    at zero, so the first table is the path correction's; stack trains only the new tensors."""
    h, c, v, depths = 8, 3, 20, 4
    g = torch.Generator().manual_seed(4)
    start = random_correction(h, c, rank=16, seed=6)
    cfg = CorrectionTrainConfig(rank=16, candidates=c, spine=True, bigram_rank=4, init=init)
    module = initial_module(cfg, h, v, start)
    hidden, out, embed = (torch.randn(depths, h, generator=g), torch.randn(v, h, generator=g),
                          torch.randn(v, h, generator=g))
    lp, col = candidates(torch.log_softmax(hidden @ out.T, -1), c)
    assert torch.allclose(path_table(module, hidden, lp, col, out[col], embed),
                          path_table(start, hidden, lp, col, out[col], embed), atol=1e-5)
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trained == ({"down.weight", "bigram_u.weight", "bigram_v.weight"} if init == "stack"
                       else {n for n, _ in module.named_parameters()})


def test_save_and_load(tmp_path):
    module = random_correction(8, 4, seed=5)
    module.save(tmp_path, {"command": "x"})
    again = load_correction(tmp_path)
    assert again.config == module.config
    assert all(torch.equal(a, b) for a, b in zip(module.state_dict().values(), again.state_dict().values()))
    assert load_correction(tmp_path / "none") is None and load_correction(None) is None


def test_shipped_correction_is_lossless_on_the_embedded_target(smol):
    """``jetflow-pc`` and ``jetflow-pcx`` (which differs from it above C' only, so at 128) with the correction
    shipped beside the causal head: greedy == transformers' generate."""
    prompt = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May."
    ids = smol.encode(prompt)
    ref = smol.model.generate(ids[None], max_new_tokens=40, do_sample=False)[0, ids.numel():].tolist()
    for name, budgets in (("jetflow-pc", (8, 64)), ("jetflow-pcx", (128,))):
        proposer = make_proposer(name, smol, draft_dtype=torch.float32)
        assert proposer.correction is not None and proposer.correction.config.candidates == 64
        for budget in budgets:
            assert generate(smol, prompt, proposer, budget=budget, max_new_tokens=40).tokens == ref


@pytest.mark.parametrize("builder", ["path_prefix", "path_tail_prefix"])
def test_sampling_with_the_path_builders_matches_the_target_distribution(small_vocab_target, builder):
    """Sample-and-match over path-corrected trees (C = 3 of 6 tokens, so path_tail_prefix drafts past the
    candidates) keeps the target's distribution."""
    from test_decode import assert_samples_match
    target, ids, n_samples, temperature = small_vocab_target, [1, 2, 3, 1, 2], 800, 0.7
    head = build_head(TrainConfig(block_size=4, num_layers=1), target).eval()
    proposer = HeadProposer(head, target, builder, correction=random_correction(head.config.hidden_size, candidates=3))
    assert_samples_match(target, ids, proposer, temperature, n_samples)


def test_correction_training_leaves_out_the_profile_prompts_and_the_heads_holdout(tmp_path, monkeypatch):
    """Neither the acceptance profile's held-out prompts nor the rows the head's training held out for its
    profile (``train --holdout``, listed in its provenance) reach the correction's training rows."""
    import json
    import jetflow.data.holdout
    from jetflow.training.correction_train import training_rows
    rows = [{"id": f"gsm8k-train:{i}", "prompt_ids": [1, 2], "response_ids": [3, 4, 5]} for i in range(6)]
    data = tmp_path / "regen.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [{"settings": {}}] + rows))
    monkeypatch.setattr(jetflow.data.holdout, "heldout_prompts", lambda n, **kw: [{"id": "gsm8k-train:1"}])
    head = tmp_path / "head"
    head.mkdir()
    cfg = CorrectionTrainConfig(data=str(data), max_seqs=0, out=str(head))
    assert [r["id"] for r in training_rows(cfg)] == [f"gsm8k-train:{i}" for i in (0, 2, 3, 4, 5)]
    assert [r["id"] for r in training_rows(dataclasses.replace(cfg, max_seqs=2))] == ["gsm8k-train:0", "gsm8k-train:2"]
    spread = dataclasses.replace(cfg, max_seqs=2, spread=True)  # evenly through the rows left, not the first two
    assert [r["id"] for r in training_rows(spread)] == ["gsm8k-train:0", "gsm8k-train:3"]
    (head / "provenance.json").write_text(json.dumps({"data": {"holdout_ids": ["gsm8k-train:4", "gsm8k-train:5"]}}))
    assert [r["id"] for r in training_rows(cfg)] == [f"gsm8k-train:{i}" for i in (0, 2, 3)]


def test_spread_from_leads_with_the_smaller_spread():
    from jetflow.training.correction_train import spread_order
    assert spread_order(10, 4) == [0, 2, 5, 7]
    assert spread_order(10, 4, first=2) == [0, 5, 2, 7]              # the 2-row spread, then the rest of the 4-row one
    for n, k in ((16_094, 4000), (7, 6), (1000, 998)):
        assert spread_order(n, k, k // 2)[:k // 2] == spread_order(n, k // 2)
        assert sorted(spread_order(n, 2 * (k // 2), k // 2)) == spread_order(n, 2 * (k // 2))  # doubling adds nothing
    nested = spread_order(100, 7, first=3)                              # 3 does not divide 7: the lead still leads
    assert nested[:3] == spread_order(100, 3) and len(set(nested)) == len(nested)
    assert set(spread_order(100, 7)) <= set(nested)
    assert spread_order(10, 4, first=4) == spread_order(10, 4, first=9) == spread_order(10, 4)  # no smaller run


def test_add_sources_appends_the_other_rows_of_those_sources_in_pool_order():
    from jetflow.cli import build_parser
    from jetflow.training.correction_train import CorrectionTrainConfig, added_rows
    from jetflow.util.flags import given
    ids = ["gsm:1", "chat:a", "code:x", "chat:b", "gsm:2", "chat:c", "other:q"]
    assert added_rows(ids, [0, 3], ("chat",)) == [1, 5]                 # chat:b already picked, not added twice
    assert added_rows(ids, [0, 3], ("chat", "code")) == [1, 2, 5]
    assert added_rows(ids, [0, 3], ()) == []
    with pytest.raises(ValueError, match="no row comes from chta"):
        added_rows(ids, [0], ("chta",))
    cfg = CorrectionTrainConfig(**given(build_parser().parse_args(
        ["train-correction", "--add-sources", "hh-rlhf-helpful-base-test,arena-hard-v2.0"]), CorrectionTrainConfig))
    assert cfg.add_sources == ("hh-rlhf-helpful-base-test", "arena-hard-v2.0")


def test_train_correction_flags_spread_and_its_command_line():
    from jetflow.cli import build_parser
    from jetflow.training.correction_train import CorrectionTrainConfig
    from jetflow.util.flags import command_line, given
    args = build_parser().parse_args(["train-correction", "--max-seqs", "3164", "--spread"])
    cfg = CorrectionTrainConfig(**given(args, CorrectionTrainConfig))
    assert cfg.spread and cfg.max_seqs == 3164
    line = command_line(cfg, CorrectionTrainConfig(), ["python", "-m", "jetflow", "train-correction"])
    assert "--spread" in line and "--first-rows" not in line
    assert not CorrectionTrainConfig(**given(build_parser().parse_args(["train-correction", "--first-rows"]),
                                             CorrectionTrainConfig)).spread
