"""Continuation after an accepted sibling on held-out prompts (issue 41): replayed tau and
``sibling_continuation`` of the causal methods against DDTree, DFlash and plain JetFlow, cell by cell.

``margins`` puts each causal row beside DDTree's of the same dataset and budget: the tau ratio and the
sibling-continuation gap against what the issue asks (1.05x at budget 16, 1.10x above; +0.10); ``headline``
is the README's compact form, ``tau / sibling continuation`` per method and cell. Both give a table's header
and lines; ``jetflow.results.tables`` renders them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

ASKED_RATIO = {16: 1.05}   # the tau ratio over DDTree asked at a budget; 1.10 at any other
ASKED_GAP = 0.10           # the sibling-continuation gap over DDTree asked everywhere
KINDS = {"gsm8k": "math", "humaneval": "code", "mt_bench": "chat"}


def _row(rows: Sequence[Mapping], method: str, dataset: str, budget: int) -> Mapping:
    hits = [r for r in rows if r["method"] == method and r["dataset"] == dataset and r["budget"] == budget]
    if not hits:
        raise ValueError(f"no {method} row for {dataset} at budget {budget}")
    return hits[0]


def _sib(row: Mapping) -> str:
    value = row.get("sibling_continuation")
    return "-" if value is None else f"{value:.2f}"


def cells(rows: Sequence[Mapping], method: str = "jetflow-pc", base: str = "ddtree") -> list[dict]:
    """Per dataset and budget of ``rows``: both taus and sibling continuations, the ratio and gap, and whether
    each clears what is asked."""
    out = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for b in sorted({r["budget"] for r in rows if r["dataset"] == ds and r["budget"] is not None}):
            mine, theirs = _row(rows, method, ds, b), _row(rows, base, ds, b)
            ratio = mine["tau"] / theirs["tau"]
            gap = mine["sibling_continuation"] - theirs["sibling_continuation"]
            out.append({"dataset": ds, "budget": b, "tau": mine["tau"], "base_tau": theirs["tau"], "ratio": ratio,
                        "ratio_ok": ratio >= ASKED_RATIO.get(b, 1.10), "sib": mine["sibling_continuation"],
                        "base_sib": theirs["sibling_continuation"], "gap": gap, "gap_ok": gap >= ASKED_GAP})
    return out


def margins(runs: Mapping[str, Sequence[Mapping]], method: str = "jetflow-pc") -> tuple[list, list]:
    """The header and the lines of a table: one line per (head, dataset, budget): DDTree's and ``method``'s tau and sibling continuation, the ratio
    and the gap, each marked with whether it clears the ask; ``runs`` maps a head label to its rows."""
    body = []
    for label, rows in runs.items():
        for c in cells(rows, method):
            body.append([label, f"{KINDS.get(c['dataset'], c['dataset'])} ({c['dataset']})", str(c["budget"]),
                         f"{c['base_tau']:.2f}", f"{c['tau']:.2f}",
                         f"{c['ratio']:.3f}x " + ("yes" if c["ratio_ok"] else "**no**"),
                         f"{c['base_sib']:.2f}", f"{c['sib']:.2f}",
                         f"{c['gap']:+.2f} " + ("yes" if c["gap_ok"] else "**no**")])
    head = ["causal head", "kind", "budget", "ddtree tau", f"{method} tau", "ratio (>= 1.05x at 16, 1.10x at 64)",
            "ddtree sibling cont.", f"{method} sibling cont.", "gap (>= +0.10)"]
    return head, body


def headline(columns: Sequence[tuple[str, str, Sequence[Mapping]]], budgets: Sequence[int] = (16, 64)) -> tuple[list, list]:
    """The header and the lines of ``tau / sibling continuation`` per method (rows) and kind and budget (columns); ``columns`` lists
    (label, method, rows) in the order shown; a chain's sibling continuation is '-'."""
    datasets = list(dict.fromkeys(r["dataset"] for _, _, rows in columns for r in rows))
    head = ["method: replayed tau / sibling cont.", *(f"{KINDS.get(d, d)} B={b}" for d in datasets for b in budgets)]
    body = [[label, *(f"{_row(rows, method, d, b)['tau']:.2f} / {_sib(_row(rows, method, d, b))}"
                      for d in datasets for b in budgets)] for label, method, rows in columns]
    return head, body
