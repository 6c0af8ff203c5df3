"""Figures and comparisons of measured rows: a ``y`` against the draft budget per method and dataset, two
methods cell by cell, and the verify cost against the tree size (``budget.measure_verify_cost``). Rows are
dicts with ``method``, ``budget``, ``y`` and maybe ``dataset``.
"""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from .palette import method_colour
from .viz_style import CONVENTIONS, DASHES, PALETTE, figure


def budget_curve(rows: Sequence[dict], y: str = "tau") -> go.Figure:
    """One line per method (colour) and dataset (dash) of ``y`` ("tau" or "speedup") against the
    draft budget on a log2 axis. Rows: dicts with ``method``, ``budget``, ``y`` and maybe ``dataset``."""
    if y not in ("tau", "speedup"):
        raise ValueError(f"y must be 'tau' or 'speedup', got {y!r}")
    series: dict[tuple, dict[int, float]] = {}
    for row in rows:
        missing = {"method", "budget", y} - row.keys()
        if missing:
            raise ValueError(f"row {row} lacks {sorted(missing)}")
        if row["budget"] < 1:
            raise ValueError(f"budget must be >= 1 on a log axis, got {row['budget']} for {row['method']!r}")
        pts = series.setdefault((row["method"], row.get("dataset")), {})
        if row["budget"] in pts:
            raise ValueError(f"two rows for method {row['method']!r}, dataset {row.get('dataset')!r}, "
                             f"budget {row['budget']}")
        pts[row["budget"]] = row[y]
    if not series:
        raise ValueError("budget_curve needs at least one row")
    datasets = list(dict.fromkeys(d for _, d in series))
    budgets = sorted({b for pts in series.values() for b in pts})
    fig = figure(f"{y} against draft budget", CONVENTIONS, height=max(450, 22 * len(series) + 160),  # legend fits
                  xaxis=dict(title=dict(text="budget (draft nodes, root excluded)"), type="log",
                             tickvals=budgets, ticktext=[str(b) for b in budgets]),
                  yaxis=dict(title=dict(text=y)), legend=dict(title=dict(text="method")))
    for (method, dataset), pts in series.items():
        xs = sorted(pts)
        name = method if len(datasets) == 1 or dataset is None else f"{method} / {dataset}"
        fig.add_trace(go.Scatter(
            x=xs, y=[pts[b] for b in xs], mode="lines+markers", name=name,
            line=dict(color=method_colour(method),
                      dash=DASHES[datasets.index(dataset) % len(DASHES)])))
    return fig


def head_to_head(rows: Sequence[dict], first: str, second: str, y: str = "tau") -> dict:
    """Compare two methods cell by cell, a cell being a (dataset, budget) both have a row for:
    {"cells": n, "at_or_above": cells where ``first`` >= ``second``, "above": strictly above,
    "gaps": {(dataset, budget): first - second}}. Rows as for ``budget_curve``."""
    values: dict[str, dict[tuple, float]] = {first: {}, second: {}}
    for row in rows:
        if row.get("method") in values:
            cell = (row.get("dataset"), row["budget"])
            if cell in values[row["method"]]:
                raise ValueError(f"two rows for method {row['method']!r} at {cell}")
            values[row["method"]][cell] = row[y]
    cells = sorted(values[first].keys() & values[second].keys(), key=lambda c: (str(c[0]), c[1]))
    if not cells:
        raise ValueError(f"no (dataset, budget) cell has rows for both {first!r} and {second!r}")
    gaps = {c: values[first][c] - values[second][c] for c in cells}
    return {"cells": len(cells), "at_or_above": sum(g >= 0 for g in gaps.values()),
            "above": sum(g > 0 for g in gaps.values()), "gaps": gaps}


def verify_cost(cost_by_size: dict[int, float], draft_s: float | None = None) -> go.Figure:
    """Seconds of one verify step against the tokens verified (budget + 1), from
    ``budget.measure_verify_cost``, on log-log axes; ``draft_s`` (one draft pass) as a dashed line."""
    if not cost_by_size:
        raise ValueError("verify_cost needs at least one measured size")
    ks = sorted(cost_by_size)
    fig = figure("Cost side: verify time against tree size", "measured on this CPU, where it grows with the tree (on a GPU expected flatter; not measured here)",
                  xaxis=dict(title=dict(text="tokens verified (budget + 1)"), type="log",
                             tickvals=ks, ticktext=[str(k) for k in ks]),
                  yaxis=dict(title=dict(text="ms per step"), type="log"))
    fig.add_trace(go.Scatter(x=ks, y=[1000 * cost_by_size[k] for k in ks], mode="lines+markers",
                             name="verify", line=dict(color=PALETTE[0])))
    if draft_s is not None:
        fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[1000 * draft_s] * 2, mode="lines", name="draft (one pass)",
                                 line=dict(color=PALETTE[1], dash="dash")))
    return fig
