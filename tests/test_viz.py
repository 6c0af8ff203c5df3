"""Tests for jetflow/views/viz.py: pure helpers against hand-worked examples and loop references, and
every figure through ``fig.to_dict()`` (traces, counts, colours, axis titles)."""
import pytest
import torch

from jetflow.views import viz, viz_rounds, viz_rows, viz_style, viz_train
from jetflow.engine.decode import Result, Round
from jetflow.engine.tree import Tree, ancestor_mask
from jetflow.drafting.builders import accum_logp, best_prefix

# node:   0     1    2    3    4    5    6           0 root
# token: 10    11   12   13   14   15   16          ├─1 ── 3 ── 5
# depth:  0     1    1    2    2    3    2          │  └─ 4
#                                                   └─2 ── 6
PARENTS = [-1, 0, 0, 1, 1, 3, 2]
SCORES = [0.0, -0.1, -1.5, -0.4, -2.0, -0.9, -2.2]
VOCAB = {i: f"t{i}" for i in range(30)}


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def tree_a() -> Tree:
    return Tree.from_lists([10 + i for i in range(7)], PARENTS, score=SCORES)


def chain4() -> Tree:
    return Tree.from_lists([20, 21, 22, 23], [-1, 0, 1, 2], score=[0.0, -0.1, -0.2, -0.3])


def make_round(tree: Tree, path, choice=None) -> Round:
    choice = choice if choice is not None else [0] * len(tree)
    committed = tree.tokens[path[1:]].tolist() + [choice[path[-1]]]
    return Round(tree, list(path), committed, list(choice), 0.0, 0.0)


def rounds_hand():
    """The worked example of test_branch_acceptance_hand_example."""
    return [make_round(tree_a(), [0, 1, 4]), make_round(tree_a(), [0, 2, 6]), make_round(tree_a(), [0]),
            make_round(chain4(), [0, 1, 2, 3])]


def trace(fig, name):
    (t,) = [t for t in fig.to_dict()["data"] if t.get("name") == name]
    return t


def segments(t):
    """Edge segments of a lines trace drawn as x0, x1, None, ..."""
    xs, ys = t["x"], t["y"]
    return [((xs[k], ys[k]), (xs[k + 1], ys[k + 1])) for k in range(0, len(xs), 3)]


# ----------------------------------------------------------------------------- layout
def test_tree_layout_hand_example():
    x, y = viz.tree_layout(tree_a())
    assert x == [0, 1, 1, 2, 2, 3, 2]
    # leaves in depth-first order take rows 0, 1, 2 (nodes 5, 4, 6); parents sit between children
    assert y == [1.25, 0.5, 2.0, 0.0, 1.0, 0.0, 2.0]


@pytest.mark.parametrize("builder,budget", [(accum_logp, 40), (best_prefix, 40), (accum_logp, 3)])
def test_tree_layout_invariants(builder, budget):
    torch.manual_seed(0)
    tree = builder(torch.randn(6, 50).log_softmax(-1), budget, root=1)
    x, y = viz.tree_layout(tree)
    kids, parents = tree.children(), tree.parents.tolist()
    for node, cs in enumerate(kids):
        if cs:
            assert min(y[c] for c in cs) <= y[node] <= max(y[c] for c in cs)
    for d in range(int(tree.depth.max()) + 1):
        level = sorted((y[i], i) for i in range(len(tree)) if x[i] == d)
        assert len({yy for yy, _ in level}) == len(level)  # no overlapping nodes
        if d:  # no crossing edges: parents appear in the same order as their children
            py = [y[parents[i]] for _, i in level]
            assert py == sorted(py)


# ----------------------------------------------------------------------------- tree figure
def test_tree_figure_bare_tree():
    fig = viz.tree_figure(tree_a(), decode=decode)
    d = fig.to_dict()
    assert [t["name"] for t in d["data"]] == ["edges", "nodes"]
    assert trace(fig, "nodes")["showlegend"] is False
    nodes = trace(fig, "nodes")
    assert list(nodes["customdata"]) == list(range(7))
    assert list(nodes["marker"]["color"]) == pytest.approx(SCORES)
    assert nodes["marker"]["cmin"] == pytest.approx(-2.2) and nodes["marker"]["cmax"] == 0.0
    assert nodes["marker"]["colorbar"]["title"]["text"] == "cum. log-prob"
    assert nodes["marker"]["symbol"][0] == "square"
    assert len(segments(trace(fig, "edges"))) == 6  # one edge per draft node
    assert "'t13'" in nodes["hovertext"][3] and "depth 2" in nodes["hovertext"][3]
    assert "target" not in nodes["hovertext"][3]
    assert d["layout"]["xaxis"]["title"]["text"] == "depth"
    assert "budget 6" in d["layout"]["title"]["text"]


def test_tree_figure_round_highlights_path():
    choice = [11, 14, 16, 15, 7, 8, 9]  # the target's argmax at every node
    rnd = make_round(tree_a(), [0, 1, 4], choice)
    fig = viz.tree_figure(rnd, decode=decode)
    accepted, rejected = trace(fig, "accepted"), trace(fig, "rejected")
    assert list(accepted["customdata"]) == [0, 1, 4]
    assert sorted(rejected["customdata"]) == [2, 3, 5, 6]
    assert rejected["marker"]["color"] == viz_style.GREY
    assert list(accepted["marker"]["color"]) == pytest.approx([0.0, -0.1, -2.0])
    assert accepted["marker"]["line"]["color"] == viz_style.PATH
    x, y = viz.tree_layout(tree_a())
    path_edges = segments(trace(fig, "accepted path"))
    assert path_edges == [((x[0], y[0]), (x[1], y[1])), ((x[1], y[1]), (x[4], y[4]))]
    assert trace(fig, "accepted path")["line"]["width"] > trace(fig, "edges")["line"]["width"]
    hover = dict(zip(rejected["customdata"], rejected["hovertext"]))
    assert "target: 't15'" in hover[3]
    assert "'t7'" in fig.to_dict()["layout"]["title"]["text"]  # bonus = target choice at node 4
    assert "(2 accepted drafts + bonus" in fig.to_dict()["layout"]["title"]["text"]
    one = viz.tree_figure(make_round(tree_a(), [0, 1], choice), decode=decode).to_dict()["layout"]["title"]["text"]
    assert "(1 accepted draft + bonus" in one


def test_tree_figure_target_choice_override_and_errors():
    fig = viz.tree_figure(tree_a(), target_choice=[1, 2, 3, 4, 5, 6, 29])
    assert "target: 29" in trace(fig, "nodes")["hovertext"][6]
    with pytest.raises(ValueError, match="target_choice has 2 entries"):
        viz.tree_figure(tree_a(), target_choice=[1, 2])
    root_only = viz.tree_figure(Tree.from_lists([5], [-1]))
    assert list(trace(root_only, "nodes")["customdata"]) == [0]


def test_render_round():
    result = Result(prompt_ids=[1], tokens=[], text="", rounds=rounds_hand())
    fig = viz.render_round(result, 1, decode=decode)
    assert fig.to_dict()["layout"]["title"]["text"].startswith("Round 2/4: 3 committed (2 accepted")
    assert list(trace(fig, "accepted")["customdata"]) == [0, 2, 6]
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        viz.render_round(result, 4)


def test_round_summary():
    result = Result(prompt_ids=[1], tokens=[], text="", rounds=rounds_hand())
    assert viz.round_summary(result, 1) == {"round": 1, "rounds": 4, "nodes": 6, "depth": 3, "accepted": 2,
                                            "committed": 3}
    assert viz.round_summary(result, 3) == {"round": 3, "rounds": 4, "nodes": 3, "depth": 3, "accepted": 3,
                                            "committed": 4}
    with pytest.raises(IndexError, match=r"\[0, 4\)"):
        viz.round_summary(result, -1)


# ----------------------------------------------------------------------------- masks
def block_mask_reference(n_ctx, n, causal):
    return torch.tensor([[k < n_ctx or not causal or k - n_ctx <= q for k in range(n_ctx + n)]
                         for q in range(n)])


def ancestor_reference(tree):
    return torch.tensor([[j in tree.path_to(i) for j in range(len(tree))] for i in range(len(tree))])


@pytest.mark.parametrize("n_ctx,n,causal", [(0, 1, True), (4, 8, True), (4, 8, False), (3, 16, True), (0, 5, False)])
def test_draft_block_mask_matches_loop(n_ctx, n, causal):
    mask = viz.draft_block_mask(n_ctx, n, causal)
    assert mask.dtype == torch.bool and mask.shape == (n, n_ctx + n)
    assert torch.equal(mask, block_mask_reference(n_ctx, n, causal))


def test_masks_figure():
    d = viz.masks_figure(block_size=5, n_ctx=3).to_dict()
    assert [t["type"] for t in d["data"]] == ["heatmap", "heatmap"]
    causal, bidir = d["data"]
    assert causal["z"] == block_mask_reference(3, 5, True).int().tolist()
    assert bidir["z"] == block_mask_reference(3, 5, False).int().tolist()
    assert list(causal["x"]) == ["c0", "c1", "c2", "s0", "s1", "s2", "s3", "s4"]
    assert list(causal["y"]) == ["s0", "s1", "s2", "s3", "s4"]
    assert d["layout"]["yaxis"]["title"]["text"] == "query (block slot)"
    assert "causal" in d["layout"]["annotations"][0]["text"]

    d = viz.masks_figure(block_size=4, n_ctx=2, tree=tree_a()).to_dict()
    assert len(d["data"]) == 3
    assert d["data"][2]["z"] == ancestor_reference(tree_a()).int().tolist()
    assert d["layout"]["xaxis3"]["title"]["text"] == "key (tree node)"
    with pytest.raises(ValueError, match="block_size >= 1"):
        viz.masks_figure(block_size=0)


# ----------------------------------------------------------------------------- acceptance
def test_branch_acceptance_hand_example():
    # attempts = children of accepted-path nodes, by (depth, sibling rank):
    #   round [0,1,4] on A: d1r0 ok, d1r1 no | children of 1: d2r0 no, d2r1 ok | node 4: none
    #   round [0,2,6] on A: d1r0 no, d1r1 ok | children of 2: d2r0 ok            | node 6: none
    #   round [0] on A:     d1r0 no, d1r1 no
    #   round [0,1,2,3] on the chain: d1r0 ok, d2r0 ok, d3r0 ok
    attempts, accepts = viz_rounds.branch_acceptance(rounds_hand())
    assert attempts.tolist() == [[4, 3], [3, 1], [1, 0]]
    assert accepts.tolist() == [[2, 1], [2, 1], [1, 0]]
    assert int(accepts.sum()) == sum(r.accepted for r in rounds_hand())
    result = Result(prompt_ids=[], tokens=[], text="", rounds=rounds_hand())
    assert torch.equal(viz_rounds.branch_acceptance(result)[0], attempts)
    empty = viz_rounds.branch_acceptance([make_round(Tree.from_lists([1], [-1]), [0])])
    assert [t.shape for t in empty] == [(0, 0), (0, 0)]


def test_acceptance_heatmap():
    d = viz_rounds.acceptance_heatmap(rounds_hand()).to_dict()
    (hm,) = d["data"]
    assert [len(row) for row in hm["z"]] == [2, 2, 2] and hm["z"][2][1] is None  # never attempted
    assert sum(hm["z"], [])[:5] == pytest.approx([0.5, 1 / 3, 2 / 3, 1.0, 1.0])
    assert list(hm["y"]) == [1, 2, 3] and list(hm["x"]) == [0, 1]
    assert hm["customdata"][0][1] == [1, 3]  # depth 1, rank 1: accepted 1 of 3
    assert d["layout"]["yaxis"]["title"]["text"] == "depth"
    assert "sibling rank" in d["layout"]["xaxis"]["title"]["text"]
    clipped = viz_rounds.acceptance_heatmap(rounds_hand(), max_depth=2, max_rank=1).to_dict()["data"][0]
    assert [len(row) for row in clipped["z"]] == [1, 1]
    assert sum(clipped["z"], []) == pytest.approx([0.5, 2 / 3])


# ----------------------------------------------------------------------------- tau
def test_tau_histogram_counts_and_mean():
    fig = viz_rounds.tau_histogram([1, 3, 3, 4, 1, 3])
    d = fig.to_dict()
    (bar,) = d["data"]
    assert list(bar["x"]) == [1, 2, 3, 4] and list(bar["y"]) == [2, 0, 3, 1]
    assert d["layout"]["shapes"][0]["x0"] == pytest.approx(2.5)
    assert "tau = 2.50" in d["layout"]["title"]["text"]
    assert viz_style.CONVENTIONS == d["layout"]["title"]["subtitle"]["text"]
    from_rounds = viz_rounds.tau_histogram(rounds_hand()).to_dict()["data"][0]  # committed: 3, 3, 1, 4
    assert list(from_rounds["x"]) == [1, 2, 3, 4] and list(from_rounds["y"]) == [1, 0, 2, 1]
    with pytest.raises(ValueError, match="at least one round"):
        viz_rounds.tau_histogram([])


def test_tokens_per_round():
    fig = viz_rounds.tokens_per_round(rounds_hand())
    assert list(trace(fig, "committed")["y"]) == [3, 3, 1, 4]
    assert list(trace(fig, "running tau")["y"]) == pytest.approx([3, 3, 7 / 3, 11 / 4])
    assert fig.to_dict()["layout"]["xaxis"]["title"]["text"] == "round"


# ----------------------------------------------------------------------------- budget curves
ROWS = [dict(method=m, budget=b, tau=t, speedup=t * 0.8) for m, pts in
        {"jetflow": [(16, 6.0), (64, 6.6), (255, 8.6)], "ddtree": [(255, 7.8), (16, 5.5)],
         "dflash": [(15, 6.0)]}.items() for b, t in pts]


def test_budget_curve_one_line_per_method():
    d = viz_rows.budget_curve(ROWS).to_dict()
    assert [t["name"] for t in d["data"]] == ["jetflow", "ddtree", "dflash"]
    ddtree = d["data"][1]
    assert list(ddtree["x"]) == [16, 255] and list(ddtree["y"]) == [5.5, 7.8]  # sorted by budget
    assert len({t["line"]["color"] for t in d["data"]}) == 3
    assert d["layout"]["xaxis"]["type"] == "log" and list(d["layout"]["xaxis"]["tickvals"]) == [15, 16, 64, 255]
    assert d["layout"]["yaxis"]["title"]["text"] == "tau"
    assert "incl. the bonus token" in d["layout"]["title"]["subtitle"]["text"]
    assert "excluding the root" in d["layout"]["title"]["subtitle"]["text"]
    speed = viz_rows.budget_curve(ROWS, y="speedup").to_dict()
    assert list(speed["data"][0]["y"]) == pytest.approx([4.8, 5.28, 6.88])


def test_budget_curve_datasets_use_dashes():
    rows = [dict(r, dataset=ds) for r in ROWS[:3] for ds in ("gsm8k", "mbpp")]
    d = viz_rows.budget_curve(rows).to_dict()
    assert len(d["data"]) == 2
    assert {t["line"]["dash"] for t in d["data"]} == {"solid", "dash"}
    assert len({t["line"]["color"] for t in d["data"]}) == 1  # one method, one colour
    many = [dict(r, dataset=f"d{k}") for r in ROWS[:3] for k in range(20)]  # 20 legend entries
    assert viz_rows.budget_curve(many).to_dict()["layout"]["height"] > d["layout"]["height"] == 450


@pytest.mark.parametrize("rows,y,match", [
    (ROWS, "loss", "y must be"), ([dict(method="a", budget=4)], "tau", "lacks"),
    ([dict(method="ar", budget=0, tau=1.0)], "tau", "budget must be >= 1"),
    (ROWS + ROWS[:1], "tau", "two rows"), ([], "tau", "at least one row")])
def test_budget_curve_errors(rows, y, match):
    with pytest.raises(ValueError, match=match):
        viz_rows.budget_curve(rows, y=y)


# ----------------------------------------------------------------------------- training
def test_training_curves():
    history = [dict(step=s, loss=3.0 / (s + 1), acc=[0.9 - 0.05 * k for k in range(15)], sim_tau=2.0 + s)
               for s in (0, 10, 20)]
    history.insert(1, dict(step=5, loss=0.6))  # a step without evaluation
    fig = viz_train.training_curves(history)
    d = fig.to_dict()
    assert [t["name"] for t in d["data"]] == ["loss", "depth 1", "depth 2", "depth 4", "depth 8", "depth 15",
                                              "simulated tau"]
    assert list(trace(fig, "loss")["x"]) == [0, 5, 10, 20]
    assert list(trace(fig, "depth 4")["y"]) == pytest.approx([0.75] * 3)
    assert list(trace(fig, "simulated tau")["x"]) == [0, 10, 20]
    assert [d["layout"][f"yaxis{k}"]["title"]["text"] for k in ("", "2", "3")] == ["loss", "accuracy",
                                                                                   "simulated tau"]
    assert d["layout"]["xaxis2"]["title"]["text"] == "step"
    assert len(viz_train.training_curves(history, depths=[3]).to_dict()["data"]) == 3
    with pytest.raises(ValueError, match="depths must lie"):
        viz_train.training_curves(history, depths=[16])


# ----------------------------------------------------------------------------- token labels
@pytest.mark.parametrize("text,label", [(" the", "·the"), ("a\nb", "a⏎b"), ("<b>", "&lt;b&gt;"),
                                        ("abcdefghijkl", "abcdefghi…"), (".", "'.'"), (" ", "'·'"),
                                        (",", "','")])
def test_node_text(text, label):
    assert viz_style.node_text(0, lambda ids: text) == label


def test_tree_figure_labels_every_node():
    rnd = make_round(tree_a(), [0, 1, 4])
    fig = viz.tree_figure(rnd, decode=decode)
    for name in ("accepted", "rejected"):
        t = trace(fig, name)
        assert t["mode"] == "markers+text"
        assert list(t["text"]) == [f"t{10 + i}" for i in t["customdata"]]
    assert list(trace(viz.tree_figure(tree_a()), "nodes")["text"]) == [str(10 + i) for i in range(7)]
    off = trace(viz.tree_figure(tree_a(), decode=decode, labels=False), "nodes")
    assert off["mode"] == "markers" and off.get("text") is None
    big = best_prefix(torch.randn(6, 50).log_softmax(-1), viz.LABEL_LIMIT, root=1)  # LABEL_LIMIT + 1 nodes
    assert trace(viz.tree_figure(big), "nodes")["mode"] == "markers"
    rows = int(max(viz.tree_layout(big)[1])) + 1
    assert viz.tree_figure(big).to_dict()["layout"]["height"] == viz.tree_height(rows) > 360
    assert viz.tree_figure(chain4()).to_dict()["layout"]["height"] == 360  # one row: the minimum


# ----------------------------------------------------------------------------- one round, stage by stage
def test_logp_table():
    logp = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.1, 0.1, 0.1, 0.7]]).log()
    hm = viz.logp_table(logp, decode=decode).to_dict()["data"][0]
    assert list(hm["x"]) == ["t0", "t1", "t2", "t3"] and list(hm["y"]) == [1, 2]
    assert hm["z"][1][3] == pytest.approx(0.7)
    top = viz.logp_table(logp, top=1).to_dict()["data"][0]  # the argmax of some depth: tokens 0 and 3
    assert list(top["x"]) == ["0", "3"] and top["z"][0] == pytest.approx([0.7, 0.0])
    with pytest.raises(ValueError, match="depths, vocab"):
        viz.logp_table(torch.zeros(4))


def test_acceptance_table():
    rows = [{"depth": 1, "drafted": "'a'", "verdict": "✅", "target": "'a'"},
            {"depth": 1, "drafted": "'b'", "verdict": "❌", "target": "'a'"},
            {"depth": 2, "drafted": "-", "verdict": "⭐", "target": "'c'"}]
    table = viz_rounds.acceptance_table(rows).to_dict()["data"][0]
    assert table["type"] == "table"
    assert list(table["cells"]["values"][2]) == ["✅", "❌", "⭐"]
    assert list(table["cells"]["values"][3]) == ["'a'", "'a'", "'c'"]
    assert table["cells"]["fill"]["color"][0][1] != table["cells"]["fill"]["color"][0][0]
    assert viz_rounds.acceptance_table(rows * 10).to_dict()["layout"]["height"] > viz_rounds.acceptance_table(rows).to_dict()["layout"]["height"]
    with pytest.raises(ValueError, match="at least one row"):
        viz_rounds.acceptance_table([])


def test_tree_mask_is_the_ancestor_mask_plus_the_prefix():
    hm = viz.tree_mask(tree_a(), decode=decode, past_len=9).to_dict()["data"][0]
    assert hm["x"][0] == "prefix (9)" and hm["y"][3] == "3:t13" and len(hm["x"]) == 8
    z = torch.tensor(hm["z"])
    assert z[:, 0].all()
    assert torch.equal(z[:, 1:].bool(), ancestor_mask(tree_a().parents))
    assert len(viz.tree_mask(tree_a()).to_dict()["data"][0]["x"]) == 7
    layout = viz.tree_mask(tree_a(), decode=decode).to_dict()["layout"]
    assert list(layout["yaxis"]["tickvals"]) == [f"{i}:t{10 + i}" for i in range(7)]  # every row labelled


def test_verify_cost():
    fig = viz_rows.verify_cost({1: 0.01, 17: 0.02, 65: 0.05}, draft_s=0.004)
    verify, draft = trace(fig, "verify"), trace(fig, "draft (one pass)")
    assert list(verify["x"]) == [1, 17, 65] and list(verify["y"]) == pytest.approx([10, 20, 50])
    assert list(draft["y"]) == pytest.approx([4, 4])
    subtitle = fig.to_dict()["layout"]["title"]["subtitle"]["text"]
    assert "not measured here" in subtitle  # nothing has run on a GPU: the GPU side is an expectation (B13)
    assert [t["name"] for t in viz_rows.verify_cost({1: 0.01}).to_dict()["data"]] == ["verify"]
    with pytest.raises(ValueError, match="at least one"):
        viz_rows.verify_cost({})


def test_distribution_check():
    fig = viz_rounds.distribution_check([1, 0, 3, 6], [0.1, 0.05, 0.25, 0.6], top=3)
    obs, exp = trace(fig, "sample-and-match"), trace(fig, "target softmax(logits / T)")
    assert list(obs["x"]) == ["3", "2", "0"]  # most likely first
    assert list(obs["y"]) == pytest.approx([0.6, 0.3, 0.1]) and list(exp["y"]) == pytest.approx([0.6, 0.25, 0.1])
    with pytest.raises(ValueError, match="entries"):
        viz_rounds.distribution_check([1], [0.5, 0.5])
    with pytest.raises(ValueError, match="one draw"):
        viz_rounds.distribution_check([0, 0], [0.5, 0.5])


# ----------------------------------------------------------------------------- reading result rows
def test_head_to_head_counts_cells_like_a_loop():
    rows = [{"method": m, "dataset": d, "budget": b, "tau": t} for m, d, b, t in [
        ("x", "g", 8, 2.0), ("y", "g", 8, 2.5), ("x", "g", 16, 3.0), ("y", "g", 16, 3.0),
        ("x", "m", 8, 1.9), ("y", "m", 8, 1.5), ("x", "m", 16, 2.0), ("z", "m", 16, 9.0)]]
    got = viz_rows.head_to_head(rows, "x", "y")
    assert got["cells"] == 3 and got["at_or_above"] == 2 and got["above"] == 1
    assert got["gaps"] == pytest.approx({("g", 8): -0.5, ("g", 16): 0.0, ("m", 8): 0.4})
    ref = sum(1 for a in rows for b in rows if a["method"] == "x" and b["method"] == "y"
              and (a["dataset"], a["budget"]) == (b["dataset"], b["budget"]) and a["tau"] >= b["tau"])
    assert ref == got["at_or_above"]
    with pytest.raises(ValueError, match="no .dataset, budget. cell"):
        viz_rows.head_to_head(rows, "x", "w")
    with pytest.raises(ValueError, match="two rows"):
        viz_rows.head_to_head(rows + rows[:1], "x", "y")
