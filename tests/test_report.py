"""The README's result tables against the committed rows they are rendered from (jetflow/report.py)."""
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
