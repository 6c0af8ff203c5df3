"""Tests for jetflow/views/explorer.py on tiny random targets: controls redraft in place, a click fills the
node panel from the recomputed logits, width reaches Algorithm 1 only, and the figure widget keeps
its traces (updated, never replaced)."""
import pytest
import torch

from jetflow.views import viz
from jetflow.views.explorer import ACCEPTED, SIDES, TRACES, TreeExplorer, uses_width, with_width
from jetflow.drafting.proposers import HeadProposer, LookupMerged, LookupProposer

pytest.importorskip("anywidget")  # plotly's FigureWidget runs on it
PROMPT = "the cat sat on the mat, the cat sat on the"


@pytest.fixture
def proposers(tiny_target):
    from jetflow.training.train import build_head
    from jetflow.training.config import TrainConfig
    rows = [{"prompt_ids": [], "response_ids": list(range(400, 1000))}]
    head = build_head(TrainConfig(block_size=6), tiny_target, rows).eval()
    jet = HeadProposer(head, tiny_target, "accum_logp", width=3)
    return {"jetflow": jet, "chain": HeadProposer(head, tiny_target, "chain"), "lookup": LookupProposer(),
            "jetflow+lookup": LookupMerged(jet)}


def test_width_reaches_algorithm_1_only(proposers):
    assert uses_width(proposers["jetflow"]) and uses_width(proposers["jetflow+lookup"])
    assert not uses_width(proposers["chain"]) and not uses_width(proposers["lookup"])
    assert with_width(proposers["jetflow"], 5).width == 5 and proposers["jetflow"].width == 3
    assert with_width(proposers["jetflow+lookup"], 2).inner.width == 2
    assert with_width(proposers["lookup"], 2) is proposers["lookup"]


def test_controls_redraft_both_sides_in_place(tiny_target, proposers):
    ex = TreeExplorer(tiny_target, proposers, prompt=PROMPT, methods=("jetflow", "lookup"), budgets=(2, 4, 8),
                      budget=4, width=3, max_new_tokens=12)
    widgets = {s: ex.figures[s] for s in SIDES}
    assert [t.name for t in ex.figures["left"].data] == list(TRACES)
    left, right = ex.summary("left"), ex.summary("right")
    assert (left["method"], left["budget"], left["width"]) == ("jetflow", 4, 3)
    assert right["method"] == "lookup" and right["width"] is None
    assert left["nodes"] == 4 and left["node"] is None
    assert ex.controls["round"].max == max(len(ex.result(s).rounds) for s in SIDES) - 1
    ex.controls["budget"].value = 8  # a slider move: both sides redraft at the new budget
    assert ex.summary("left")["nodes"] == 8 and ex.summary("left")["budget"] == 8
    assert all(ex.figures[s] is widgets[s] for s in SIDES)  # the same widgets, updated in place
    accepted = ex.figures["left"].data[3].marker
    assert accepted.colorscale is None and accepted.colorbar.title.text is None and accepted.color == ACCEPTED
    title = ex.figures["left"].layout.title.text
    assert title.startswith("jetflow @ 8: Round 1/")
    shown = [int(i) for i in ex.figures["left"].data[2].customdata] + [int(i) for i in ex.figures["left"].data[3].customdata]
    assert sorted(shown) == list(range(9))
    ex.controls["width"].value = 1  # width 1: Algorithm 1 grows a single chain
    assert ex.summary("left")["depth"] == min(8, 5) and ex.summary("left")["width"] == 1
    ex.controls["right"].value = "chain"
    assert ex.summary("right")["method"] == "chain"
    ex.controls["prompt"].value = "a typed prompt"
    res = ex.result("left")
    assert res.prompt_ids == tiny_target.encode("a typed prompt").tolist()
    assert "a typed prompt" in ex.texts["left"].value and "<mark" in ex.texts["left"].value


def test_click_shows_path_top_choices_and_mask_row(tiny_target, proposers):
    ex = TreeExplorer(tiny_target, proposers, prompt=PROMPT, budgets=(4,), budget=4, max_new_tokens=8)
    ex.controls["round"].value = 1
    r = ex.round_index("left")
    tree = ex.result("left").rounds[r].tree
    node = int(tree.depth.argmax())
    assert "click a node" in ex.nodes["left"].value
    ex.click("left", node)
    info = ex.summary("left")["node"]
    assert info["path"] == tree.path_to(node) and info["mask_row"] == sorted(tree.path_to(node))
    assert len(info["top"]) == 5 and f"node {node}" in ex.nodes["left"].value
    ring = ex.figures["left"].data[4]
    x, y = viz.tree_layout(tree)
    assert list(ring.x) == [x[i] for i in info["mask_row"]] and list(ring.y) == [y[i] for i in info["mask_row"]]
    # the target's top choice at the node is what the decode loop recorded as its argmax there
    choice = ex.result("left").rounds[r].target_choice[node]
    assert info["top"][0][0] == repr(tiny_target.decode([choice]))
    ex.controls["budget"].value = 4  # no change: the selection stays
    ex.controls["left"].value = "lookup"  # a new setting clears it
    assert ex.summary("left")["node"] is None and ex.figures["left"].data[4].x == ()
    with pytest.raises(IndexError):
        ex.click("left", 99)
    with pytest.raises(ValueError, match="side"):
        ex.click("middle", 0)


def test_errors(tiny_target, proposers):
    with pytest.raises(ValueError, match="at least one proposer"):
        TreeExplorer(tiny_target, {})
    with pytest.raises(ValueError, match="not one of the budgets"):
        TreeExplorer(tiny_target, proposers, budgets=(4,), budget=16)
    with pytest.raises(ValueError, match="must be among"):
        TreeExplorer(tiny_target, proposers, methods=("jetflow", "nope"))
