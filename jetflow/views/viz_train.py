"""Training curves of several heads side by side (``viz.training_curves`` draws one run in detail).

    fig = heads_curves(recipes.shipped_histories())   # {"jetflow": history, "dflash": history}
    fig = data_curve(curve_rows, budget=64)           # tau against response tokens seen (jetflow.results.curve)
    curve_points(history)                              # [(step, sim_tau, depth-1 accuracy), ...]

A history is what ``train`` writes to ``out/history.jsonl``: one entry per step, with ``acc`` (per-depth
held-out accuracy) and ``sim_tau`` on evaluated steps and None elsewhere.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from jetflow.evaluation.rows import at_budget
from .viz import PALETTE, TEMPLATE


def curve_points(history: Sequence[dict]) -> list[tuple[int, float, float]]:
    """(step, simulated tau, depth-1 accuracy) of every evaluated entry, in step order."""
    evals = [h for h in history if h.get("acc") is not None and h.get("sim_tau") is not None]
    return sorted((int(h["step"]), float(h["sim_tau"]), float(h["acc"][0])) for h in evals)


def heads_curves(histories: Mapping[str, Sequence[dict]], title: str = "Held-out curves") -> go.Figure:
    """Two panels over ``step``, one line per head: held-out simulated tau and depth-1 accuracy."""
    if not histories:
        raise ValueError("heads_curves needs at least one history")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["simulated tau", "depth-1 accuracy"])
    for i, (name, history) in enumerate(histories.items()):
        points = curve_points(history)
        if not points:
            raise ValueError(f"history {name!r} has no evaluated step")
        steps, taus, acc1 = zip(*points)
        color = PALETTE[i % len(PALETTE)]
        for col, ys in ((1, taus), (2, acc1)):
            fig.add_trace(go.Scatter(x=steps, y=ys, mode="lines+markers", name=name, legendgroup=name,
                                     showlegend=col == 1, line=dict(color=color)), row=1, col=col)
    for col, label in ((1, "simulated tau"), (2, "accuracy")):
        fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_yaxes(title_text=label, row=1, col=col)
    fig.update_layout(template=TEMPLATE, title=dict(
        text=title, subtitle=dict(text="simulated tau = 1 + sum_k prod_{i<=k} acc_i (an argmax chain)")))
    return fig


def data_curve(rows: Sequence[dict], budget: int) -> go.Figure:
    """Replayed tau at ``budget`` against the response tokens each head saw in training (log x): one panel
    per dataset, one line per head method (``jetflow.results.curve`` rows: ``response_tokens_seen``, ``tau``)."""
    picked = at_budget(list(rows), budget)
    datasets, methods = list(dict.fromkeys(r["dataset"] for r in picked)), list(dict.fromkeys(r["method"] for r in picked))
    fig = make_subplots(rows=1, cols=len(datasets), subplot_titles=datasets, shared_yaxes=True)
    for col, ds in enumerate(datasets, start=1):
        for i, m in enumerate(methods):
            points = sorted((r["response_tokens_seen"], r["tau"]) for r in picked if r["dataset"] == ds and r["method"] == m)
            if points:
                x, y = zip(*points)
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=m, legendgroup=m, showlegend=col == 1,
                                         line=dict(color=PALETTE[i % len(PALETTE)])), row=1, col=col)
        fig.update_xaxes(type="log", title_text="response tokens seen", row=1, col=col)
    fig.update_yaxes(title_text=f"replayed tau (budget {budget})", row=1, col=1)
    fig.update_layout(template=TEMPLATE, title=dict(text="Replayed tau against training data"))
    return fig
