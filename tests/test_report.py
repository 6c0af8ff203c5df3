"""The result tables of README.md and docs/ against the committed rows they are rendered from (jetflow/results/report.py)."""
import json
import shutil

import pytest

from jetflow.results import report, tables
from jetflow.cli import help_tables, main

ROW = {"method": "jetflow", "dataset": "gsm8k", "budget": 16, "tau": 2.567, "speedup": 1.7249,
       "identical_to_ar": 5, "n_prompts": 20}


def test_cells():
    assert tables.cell(ROW) == "2.57 / 1.72x (5/20)"
    assert tables.cell({**ROW, "tau": None, "speedup": None}) == "- / - (5/20)"
    assert tables.cell({"tau": 3.049}) == "3.05" and tables.cell(None) == "-"


def test_documents_match_the_committed_results():
    assert report.check(extra=help_tables()) == []


def test_every_table_is_in_a_document_and_every_block_is_checked():
    assert set(report.TABLES) == {n for names in report.DOCUMENTS.values() for n in names}
    documents = report.documents(help_tables())
    docs = [report.ROOT / "README.md", report.ROOT / "CONTRIBUTING.md", *sorted((report.ROOT / "docs").glob("*.md"))]
    for path in docs:  # a marker block outside DOCUMENTS would never be checked
        name = path.relative_to(report.ROOT).as_posix()
        assert report.markers(path.read_text()) == list(documents.get(name, ())), name


def _copy_docs(root):
    for doc in report.documents(help_tables()):
        (root / doc).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(report.ROOT / doc, root / doc)


def test_a_stale_table_is_named_and_rewritten(tmp_path):
    _copy_docs(tmp_path)
    results = tmp_path / "docs" / "results.md"
    text = results.read_text()
    start = text.index("<!-- table:replay-tau -->")
    row = text.index("| GSM8K | ddtree |", start)
    results.write_text(text[:row] + text[row:].replace("| GSM8K | ddtree |", "| GSM8K | ddtree | 9.99 |", 1))
    readme = tmp_path / "README.md"
    assert report.check(readme) == ["docs/results.md:replay-tau"]
    assert main(["report", "--check", "--readme", str(readme)]) == 1
    assert report.update(readme) == ["docs/results.md:replay-tau"] and results.read_text() == text
    assert main(["report", "--check", "--readme", str(readme)]) == 0


def test_a_stale_cli_page_fails_the_check(tmp_path):
    """docs/cli.md's --help pages are rendered by the CLI and checked by ``report --check`` like the tables."""
    _copy_docs(tmp_path)
    page = tmp_path / "docs" / "cli.md"
    text = page.read_text()
    page.write_text(text.replace("--max-new-tokens", "--max-new-tokenz", 1))
    readme = tmp_path / "README.md"
    assert report.check(readme) == [] and report.check(readme, extra=help_tables()) == ["docs/cli.md:cli-help"]
    assert main(["report", "--check", "--readme", str(readme)]) == 1
    assert main(["report", "--write", "--readme", str(readme)]) == 0 and page.read_text() == text


def test_missing_markers_and_results_are_clear_errors(tmp_path, capsys):
    (tmp_path / "docs").mkdir()
    for doc in report.DOCUMENTS:
        (tmp_path / doc).write_text("# no tables\n")
    readme = tmp_path / "README.md"
    assert report.check(readme) == [f"{doc}:{n}" for doc, names in report.DOCUMENTS.items() for n in names]
    with pytest.raises(ValueError, match="no <!-- table:headline -->"):
        report.update(readme)
    assert main(["report", "--results", str(tmp_path)]) == 2
    assert "rows.json is missing" in capsys.readouterr().err


def _rows(folder, rows):
    folder.mkdir(parents=True)
    (folder / "rows.json").write_text(json.dumps(rows))


def test_headline_takes_each_methods_best_budget_within_its_own_run(tmp_path):
    from jetflow.evaluation.rows import CHAIN_NOTE
    base = {"identical_to_ar": 3, "n_prompts": 4, "tokens_per_s": 10.0, "hardware": "a CPU", "dtype": "bfloat16",
            "torch": "2.x"}
    for ds in ("gsm8k", "math500"):
        _rows(tmp_path / f"grid-{ds}", [
            {**base, "dataset": ds, "method": "ar", "budget": None, "tau": 1.0, "speedup": 1.0},
            {**base, "dataset": ds, "method": "lookup", "budget": 16, "tau": 2.0, "speedup": 1.4},
            {**base, "dataset": ds, "method": "lookup", "budget": 64, "tau": 2.1, "speedup": 1.6},
            {**base, "dataset": ds, "method": "lookup", "budget": 128, "tau": 2.1, "speedup": 1.7,
             "note": CHAIN_NOTE.format(64)}])  # a repeat of budget 64's runs: never picked
        _rows(tmp_path / f"other-{ds}", [
            {**base, "dataset": ds, "method": "lookup", "budget": 16, "tau": 9.0, "speedup": 9.0},  # not its source
            {**base, "dataset": ds, "method": "jetflow", "budget": 8, "tau": 2.5, "speedup": 1.9,
             "identical_to_ar": 1, "dtype": "float32"},
            {**base, "dataset": ds, "method": "jetflow", "budget": 16, "tau": 2.0, "speedup": 1.1,  # sampled:
             "identical_to_ar": 0, "dtype": "float32", "temperature": 0.7}])  # not counted as fp32 identity
    table = tables.headline(tmp_path, (("ar", "grid"), ("lookup", "grid"), ("jetflow", "other"))).splitlines()
    assert table[2] == "| ar | 1.00 / 1.00x (3/4) | 1.00 / 1.00x (3/4) |"
    assert table[3] == "| lookup | 2.10 / 1.60x (3/4), B=64 | 2.10 / 1.60x (3/4), B=64 |"
    assert table[4] == "| jetflow | 2.50 / 1.90x (1/4), B=8 | 2.50 / 1.90x (1/4), B=8 |"
    assert table[-1].startswith("Runs (`data/results/`, each with its own AR): `grid-*`: ar, lookup; `other-*`: jetflow.")
    assert table[-1].endswith("In fp32, 2 of 8 decoded outputs of the committed runs are identical to AR's.")
    with pytest.raises(ValueError, match="grid-gsm8k has no ddtree row"):
        tables.headline(tmp_path, (("ddtree", "grid"),))


def test_grid_marks_reused_budgets_budget_free_methods_and_each_rows_best(tmp_path):
    from jetflow.evaluation.rows import CHAIN_NOTE
    base = {"dataset": "math500", "identical_to_ar": 2, "n_prompts": 3, "tokens_per_s": 12.34}
    rows = [{**base, "method": "ar", "budget": None, "tau": 1.0, "speedup": 1.0},
            {**base, "method": "hf-lookup", "budget": None, "tau": None, "speedup": 1.5},
            {**base, "method": "dflash", "budget": 16, "tau": 1.5, "speedup": 0.9},
            {**base, "method": "dflash", "budget": 32, "tau": 1.5, "speedup": 0.9, "note": CHAIN_NOTE.format(16)},
            {**base, "method": "jetflow", "budget": 16, "tau": 2.0, "speedup": 1.2},
            {**base, "method": "jetflow", "budget": 32, "tau": 2.2, "speedup": 1.3}]
    (tmp_path / "grid").mkdir()
    (tmp_path / "grid" / "rows.json").write_text(json.dumps(rows))
    lines = tables.grid(tmp_path, ["grid"]).splitlines()
    assert lines[0] == f"| dataset | {tables.CELLS} | budget 16 | budget 32 |"
    assert lines[2] == "| MATH-500 | hf-lookup (no budget) | - / 1.50x (2/3) |  |"
    assert lines[3] == "| MATH-500 | dflash | 1.50 / **0.90x** (2/3) | = budget 16 |"
    assert lines[4] == "| MATH-500 | jetflow | 2.00 / 1.20x (2/3) | 2.20 / **1.30x** (2/3) |"
    assert lines[-1] == "AR tokens/s: 12.3 on MATH-500."
