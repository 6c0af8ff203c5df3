"""jetflow/views/viz_trees.py: the helpers read the rows they are given, the figures plot them."""
from jetflow.views import viz_trees

ROWS = ([{"table": "spine", "dataset": "toy", "state": s, "depth": d, "reached": 10, "argmax_accept": a}
         for s, rates in (("spine", (0.8, 0.7)), ("off_spine", (0.3, 0.2))) for d, a in zip((2, 1), rates[::-1])]
        + [{"table": "heatmap", "dataset": "toy", "state": "spine", "depth": d, "rank": r, "reached": 10,
            "accept": None if (d, r) == (2, 1) else d / 10 + r / 100} for d in (1, 2) for r in (0, 1)])


def test_spine_series_sorts_by_depth_per_state():
    assert viz_trees.spine_series(ROWS, "toy") == {"spine": ([1, 2], [0.8, 0.7]), "off_spine": ([1, 2], [0.3, 0.2])}
    fig = viz_trees.spine_figure(ROWS).to_dict()
    assert [t["name"] for t in fig["data"]] == ["toy: on the argmax spine", "toy: off the spine"]
    assert list(fig["data"][1]["y"]) == [0.3, 0.2]


def test_heatmap_grid_and_figure():
    depths, ranks, z = viz_trees.heatmap_grid(ROWS, "toy", "spine")
    assert depths == [1, 2] and ranks == [0, 1] and z == [[0.1, 0.11], [0.2, None]]
    fig = viz_trees.heatmap_figure(ROWS, "toy").to_dict()
    assert fig["data"][0]["type"] == "heatmap" and fig["layout"]["xaxis"]["title"]["text"] == "rank in the head's row"


def test_rows_of_the_corrected_head_are_kept_apart():
    corrected = [r | {"head": "corrected", "argmax_accept": 0.5} for r in ROWS if r["table"] == "spine"]
    rows = ROWS + corrected
    assert viz_trees.spine_series(rows, "toy") == viz_trees.spine_series(ROWS, "toy")
    assert viz_trees.spine_series(rows, "toy", "corrected")["off_spine"] == ([1, 2], [0.5, 0.5])
    fig = viz_trees.correction_figure(rows, "toy").to_dict()
    assert [t["name"] for t in fig["data"]] == ["causal head: on the argmax spine", "causal head: off the spine",
                                                "path-corrected: on the argmax spine", "path-corrected: off the spine"]
    assert fig["data"][2]["line"]["dash"] != fig["data"][0]["line"]["dash"]
