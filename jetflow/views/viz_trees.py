"""Figures of where trees are accepted: the diagnosis rows of ``jetflow.results.diagnose`` (``python -m jetflow
diagnose``) as plotly figures. Like ``viz``, every function takes rows and returns a ``go.Figure``; the
numbers are the rows' own (``spine_series`` and ``heatmap_grid`` are the pure helpers, tested)."""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go

from .viz_style import DASHES, TEMPLATE, colour

STATE_NAMES = {"spine": "on the argmax spine", "off_spine": "off the spine", "after_sibling": "right after a sibling"}
HEAD_NAMES = {"causal": "causal head", "corrected": "path-corrected"}


def _head(row: dict) -> str:
    return row.get("head", "causal")  # rows from before the path correction are the head's own


def spine_series(rows: Sequence[dict], dataset: str, head: str = "causal") -> dict[str, tuple[list[int], list[float | None]]]:
    """state -> (depths, argmax acceptance) for one dataset's ``table == "spine"`` rows of ``head``."""
    out: dict[str, tuple[list[int], list[float | None]]] = {}
    for r in sorted((r for r in rows if r["table"] == "spine" and r["dataset"] == dataset and _head(r) == head),
                    key=lambda r: r["depth"]):
        depths, rates = out.setdefault(r["state"], ([], []))
        depths.append(r["depth"])
        rates.append(r["argmax_accept"])
    return out


def spine_figure(rows: Sequence[dict]) -> go.Figure:
    """P(the depth-d argmax is accepted) against depth, one colour per dataset, one dash per path state."""
    fig = go.Figure(layout=dict(template=TEMPLATE, title=dict(text="Is the next depth's argmax right?",
                    subtitle=dict(text="causal head, greedy; given the true path so far, by its ranks")),
                    xaxis_title="depth d", yaxis_title="P(argmax accepted)", yaxis_range=[0, 1]))
    for i, ds in enumerate(dict.fromkeys(r["dataset"] for r in rows if r["table"] == "spine")):
        for j, (state, (depths, rates)) in enumerate(spine_series(rows, ds).items()):
            fig.add_trace(go.Scatter(x=depths, y=rates, mode="lines+markers", name=f"{ds}: {STATE_NAMES[state]}",
                                     line=dict(color=colour(i), dash=DASHES[j % len(DASHES)])))
    return fig


def correction_figure(rows: Sequence[dict], dataset: str) -> go.Figure:
    """One dataset's argmax acceptance on and off the spine, the head's rows (solid) against the
    path-corrected ones (dashed): what the correction buys off the spine."""
    fig = go.Figure(layout=dict(template=TEMPLATE, title=dict(text=f"Before and after the path correction: {dataset}",
                    subtitle=dict(text="P(the depth-d argmax is accepted | the true path so far)")),
                    xaxis_title="depth d", yaxis_title="P(argmax accepted)", yaxis_range=[0, 1]))
    for j, head in enumerate(HEAD_NAMES):
        for i, (state, (depths, rates)) in enumerate(spine_series(rows, dataset, head).items()):
            fig.add_trace(go.Scatter(x=depths, y=rates, mode="lines+markers", name=f"{HEAD_NAMES[head]}: {STATE_NAMES[state]}",
                                     line=dict(color=colour(i), dash=DASHES[j % len(DASHES)])))
    return fig


def heatmap_grid(rows: Sequence[dict], dataset: str, state: str, head: str = "causal"
                 ) -> tuple[list[int], list[int], list[list]]:
    """(depths, ranks, z) with z[d][r] the acceptance of the rank-r token at depth d (None: not reached)."""
    cells = {(r["depth"], r["rank"]): r["accept"] for r in rows
             if r["table"] == "heatmap" and r["dataset"] == dataset and r["state"] == state and _head(r) == head}
    depths, ranks = sorted({d for d, _ in cells}), sorted({k for _, k in cells})
    return depths, ranks, [[cells.get((d, k)) for k in ranks] for d in depths]


def heatmap_figure(rows: Sequence[dict], dataset: str, state: str = "spine", head: str = "causal") -> go.Figure:
    """Acceptance per (depth, rank) for one dataset, path state and head (``causal`` or ``corrected``), a heatmap."""
    depths, ranks, z = heatmap_grid(rows, dataset, state, head)
    fig = go.Figure(go.Heatmap(x=ranks, y=depths, z=z, colorscale="Viridis", zmin=0, zmax=1,
                               colorbar=dict(title="accepted")),
                    layout=dict(template=TEMPLATE, title=dict(text=f"Acceptance by depth and rank: {dataset}",
                                subtitle=dict(text=f"{HEAD_NAMES[head]}, parent {STATE_NAMES[state]}")),
                                xaxis_title="rank in the head's row", yaxis_title="depth d", yaxis_autorange="reversed"))
    return fig
