"""The tree-builder tables of docs/results.md (``tables.trees_vs_ddtree``, ``stop_vs_fixed``, ``sampling``)
on hand-made rows."""
import json

from jetflow.results import tables


def write(folder, rows):
    folder.mkdir(parents=True)
    (folder / "rows.json").write_text(json.dumps(rows))


def replay_row(method, budget, tau, nodes, pred, width=None):
    return {"method": method, "dataset": "gsm8k", "budget": budget, "width": width, "tau": tau, "nodes": nodes,
            "tau_per_node": tau / nodes, "predicted_speedup": pred}


def test_trees_table_has_a_ratio_per_cell_and_ranks_only_causal_head_methods(tmp_path):
    write(tmp_path / "r", [replay_row("ddtree", 8, 2.0, 8, 1.2), replay_row("jetflow-cal", 8, 2.2, 8, 1.3),
                           replay_row("dflash", 8, 3.0, 8, 1.4), replay_row("jetflow", 8, 2.1, 8, 1.25, width=7),
                           replay_row("jetflow", 8, 2.9, 8, 1.25, width=4)])   # another width: not shown
    table = tables.trees_vs_ddtree(tmp_path, "r")
    assert "| GSM8K | 8 | 2.00 | 2.10 (1.05) | 2.20 (1.10) | 3.00 (1.50) | 1.100x (jetflow-cal) |" in table


def test_stop_table_picks_each_methods_best_predicted_budget(tmp_path):
    write(tmp_path / "r", [replay_row("jetflow-stop", 8, 2.3, 5.5, 1.32), replay_row("jetflow-stop", 255, 2.3, 5.5, 1.32),
                           replay_row("jetflow-cal", 8, 2.5, 8, 1.30), replay_row("jetflow-cal", 64, 3.0, 64, 0.7)])
    lines = tables.stop_vs_fixed(tmp_path, "r").splitlines()
    assert lines[2] == "| GSM8K | jetflow-stop | 8 | 2.30 | 5.5 | 0.418 | 1.32x |"   # a tie: the smaller cap
    assert lines[3] == "| GSM8K | jetflow-cal | 8 | 2.50 | 8.0 | 0.312 | 1.30x |" and len(lines) == 4


def test_sampling_table_puts_temperatures_side_by_side(tmp_path):
    def rows(cal, dd):
        return [{"method": "ar", "dataset": "math500", "budget": None, "tau": 1.0},
                {"method": "jetflow-cal", "dataset": "math500", "budget": 32, "tau": cal},
                {"method": "ddtree", "dataset": "math500", "budget": 32, "tau": dd}]
    write(tmp_path / "g", rows(2.2, 2.0))
    write(tmp_path / "t", rows(1.8, 1.8))
    table = tables.sampling(tmp_path, (("greedy", "g"), ("T = 1.0", "t")))
    assert table.splitlines()[0] == "| dataset | method | budget | tau, greedy | tau, T = 1.0 |"
    assert "| MATH-500 | jetflow-cal | 32 | 2.20 (1.10) | 1.80 (1.00) |" in table
    assert "| MATH-500 | ddtree | 32 | 2.00 | 1.80 |" in table and "| ar |" not in table
