"""The README's result tables against the committed rows they are rendered from (jetflow/report.py)."""
import json
import shutil

import pytest

from jetflow import report
from jetflow.cli import main

ROW = {"method": "jetflow", "dataset": "gsm8k", "budget": 16, "tau": 2.567, "speedup": 1.7249,
       "identical_to_ar": 5, "n_prompts": 20}


def test_cells():
    assert report.cell(ROW) == "2.57 / 1.72x (5/20)"
    assert report.cell({**ROW, "tau": None, "speedup": None}) == "- / - (5/20)"
    assert report.cell({"tau": 3.049}) == "3.05" and report.cell(None) == "-"


def test_readme_tables_match_the_committed_results():
    assert report.check() == []


def test_a_stale_table_is_named_and_rewritten(tmp_path):
    readme = tmp_path / "README.md"
    shutil.copy(report.ROOT / "README.md", readme)
    text = readme.read_text()
    start = text.index("<!-- table:replay-tau -->")
    row = text.index("| GSM8K | ddtree |", start)
    readme.write_text(text[:row] + text[row:].replace("| GSM8K | ddtree |", "| GSM8K | ddtree | 9.99 |", 1))
    assert report.check(readme) == ["replay-tau"]
    assert main(["report", "--check", "--readme", str(readme)]) == 1
    assert report.update(readme) == ["replay-tau"] and readme.read_text() == text
    assert main(["report", "--check", "--readme", str(readme)]) == 0


def test_missing_markers_and_results_are_clear_errors(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# no tables\n")
    assert report.check(readme) == list(report.TABLES)
    with pytest.raises(ValueError, match="no <!-- table:replay-tau -->"):
        report.update(readme)
    assert main(["report", "--results", str(tmp_path)]) == 2
    assert "cpu-replay-tau/rows.json is missing" in capsys.readouterr().err


def test_grid_marks_reused_budgets_budget_free_methods_and_each_rows_best(tmp_path):
    from jetflow.bench import CHAIN_NOTE
    base = {"dataset": "math500", "identical_to_ar": 2, "n_prompts": 3, "tokens_per_s": 12.34}
    rows = [{**base, "method": "ar", "budget": None, "tau": 1.0, "speedup": 1.0},
            {**base, "method": "hf-lookup", "budget": None, "tau": None, "speedup": 1.5},
            {**base, "method": "dflash", "budget": 16, "tau": 1.5, "speedup": 0.9},
            {**base, "method": "dflash", "budget": 32, "tau": 1.5, "speedup": 0.9, "note": CHAIN_NOTE.format(16)},
            {**base, "method": "jetflow", "budget": 16, "tau": 2.0, "speedup": 1.2},
            {**base, "method": "jetflow", "budget": 32, "tau": 2.2, "speedup": 1.3}]
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "rows.json").write_text(json.dumps(rows))
    lines = report.grid(tmp_path, ["grid"]).splitlines()
    assert lines[0] == "| dataset | method | budget 16 | budget 32 |"
    assert lines[2] == "| MATH-500 | hf-lookup (no budget) | - / 1.50x (2/3) |  |"
    assert lines[3] == "| MATH-500 | dflash | 1.50 / **0.90x** (2/3) | = budget 16 |"
    assert lines[4] == "| MATH-500 | jetflow | 2.00 / 1.20x (2/3) | 2.20 / **1.30x** (2/3) |"
    assert lines[-1] == "AR tokens/s: 12.3 on MATH-500."
