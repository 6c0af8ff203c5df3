"""The ablation of the corrections beside the path one (issue 41): replayed tau at budgets 16 and 64, the
continuation after an accepted sibling, and each correction's training minutes from its provenance.

Rows: ``replay`` folders of correction methods on one head; minutes: ``correction.json`` beside that head
(``jetflow-pc``) or in ``<head>-<variant>`` (``Method.correction``), its ``minutes_this_call`` (features + fit
as run here; '-' where the provenance did not record them).
"""
from __future__ import annotations

import json
from pathlib import Path

from jetflow.util.paths import REPO


def training_minutes(head: str | Path, variant: str) -> str:
    """'features + fit' minutes of the correction ``variant`` ('' for the head's own) of ``head``."""
    folder = REPO / head if not variant else REPO / f"{head}-{variant}"
    path = folder / "correction.json"
    if not path.is_file():
        return "-"
    spent = json.loads(path.read_text())["provenance"].get("minutes_this_call")
    return "-" if not spent else f"{spent['features']:.1f} + {spent['fit']:.1f}"


def cell(rows: list[dict], method: str, dataset: str, budget: int, key: str) -> str:
    """One row's ``key`` (tau or sibling_continuation with its count) as text; '-' where absent."""
    row = next((r for r in rows if (r["method"], r["dataset"], r["budget"]) == (method, dataset, budget)), None)
    if row is None or row.get(key) is None:
        return "-"
    return f"{row[key]:.2f}" if key == "tau" else f"{row[key]:.2f} ({row['sibling_n']})"


def ablation_markdown(results: Path, names: list[str], head: str) -> str:
    """The ablation table of ``data/results/NAME`` for each of ``names`` (rows of one head's correction
    methods, one replay per correction: replay drafts once per head and correction)."""
    from jetflow.drafting.methods import METHODS
    rows = [r for name in names for r in json.loads((Path(results) / name / "rows.json").read_text())]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines = ["| method | dataset | tau B=16 | tau B=64 | sibling cont. B=16 | sibling cont. B=64 | training min |",
             "|---|---|---|---|---|---|---|"]
    for method in methods:
        minutes = training_minutes(head, METHODS[method].correction)
        for dataset in dict.fromkeys(r["dataset"] for r in rows):
            lines.append(f"| {method} | {dataset} | " + " | ".join(
                cell(rows, method, dataset, b, k) for k in ("tau", "sibling_continuation") for b in (16, 64))
                + f" | {minutes} |")
    return "\n".join(lines) + ("\n\nsibling cont. = after an accepted node that was not its parent's most probable "
                               "child, how often the target's next token was that node's own first child (rounds "
                               "counted in brackets); training min = features + fit minutes on the shared 2-core CPU "
                               "('-': the path correction's provenance records none)")
