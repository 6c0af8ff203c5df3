"""Training curves: one run in detail (loss, per-depth accuracy, simulated tau), several heads side by side,
and replayed tau against the training data seen.

    fig = training_curves(history)                     # one run: loss, accuracy per depth, simulated tau
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
from .palette import method_colour
from .viz_style import PATH, TEMPLATE, colour


def curve_points(history: Sequence[dict]) -> list[tuple[int, float, float]]:
    """(step, simulated tau, depth-1 accuracy) of every evaluated entry, in step order."""
    evals = [h for h in history if h.get("acc") is not None and h.get("sim_tau") is not None]
    return sorted((int(h["step"]), float(h["sim_tau"]), float(h["acc"][0])) for h in evals)


def heads_curves(histories: Mapping[str, Sequence[dict]], title: str = "Held-out curves") -> go.Figure:
    """Two panels over ``step``, one line per head: held-out simulated tau and depth-1 accuracy."""
    if not histories:
        raise ValueError("heads_curves needs at least one history")
    fig = make_subplots(rows=1, cols=2, subplot_titles=["simulated tau", "depth-1 accuracy"])
    for name, history in histories.items():
        points = curve_points(history)
        if not points:
            raise ValueError(f"history {name!r} has no evaluated step")
        steps, taus, acc1 = zip(*points)
        color = method_colour(name)
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
        for m in methods:
            points = sorted((r["response_tokens_seen"], r["tau"]) for r in picked if r["dataset"] == ds and r["method"] == m)
            if points:
                x, y = zip(*points)
                fig.add_trace(go.Scatter(x=x, y=y, mode="lines+markers", name=m, legendgroup=m, showlegend=col == 1,
                                         line=dict(color=method_colour(m))), row=1, col=col)
        fig.update_xaxes(type="log", title_text="response tokens seen", row=1, col=col)
    fig.update_yaxes(title_text=f"replayed tau (budget {budget})", row=1, col=1)
    fig.update_layout(template=TEMPLATE, title=dict(text="Replayed tau against training data"))
    return fig


def _default_depths(n: int) -> list[int]:
    return sorted({d for d in (1, 2, 4, 8, 16) if d <= n} | {n})


def training_curves(history: Sequence[dict], depths: Sequence[int] | None = None) -> go.Figure:
    """Three panels over ``step``: loss, per-depth accuracy (``acc[k-1]`` is depth k; by default
    depths 1, 2, 4, 8, ... and the deepest) and simulated tau. Entries may omit ``acc``/``sim_tau``
    (or set them to None) on steps without evaluation."""
    if not history:
        raise ValueError("training_curves needs at least one history entry")
    evals = [h for h in history if h.get("acc") is not None]
    n_depth = max((len(h["acc"]) for h in evals), default=0)
    depths = _default_depths(n_depth) if depths is None and n_depth else list(depths or [])
    bad = [d for d in depths if not 1 <= d <= n_depth]
    if bad:
        raise ValueError(f"depths must lie in [1, {n_depth}], got {bad}")
    fig = make_subplots(rows=1, cols=3, subplot_titles=["loss", "accuracy per depth", "simulated tau"])
    fig.add_trace(go.Scatter(x=[h["step"] for h in history], y=[h["loss"] for h in history], mode="lines",
                             name="loss", line=dict(color="black")), row=1, col=1)
    for j, d in enumerate(depths):
        pts = [h for h in evals if len(h["acc"]) >= d]
        fig.add_trace(go.Scatter(x=[h["step"] for h in pts], y=[float(h["acc"][d - 1]) for h in pts],
                                 mode="lines+markers", name=f"depth {d}",
                                 line=dict(color=colour(j))), row=1, col=2)
    taus = [h for h in history if h.get("sim_tau") is not None]
    fig.add_trace(go.Scatter(x=[h["step"] for h in taus], y=[h["sim_tau"] for h in taus], mode="lines+markers",
                             name="simulated tau", line=dict(color=PATH)), row=1, col=3)
    for col, label in enumerate(["loss", "accuracy", "simulated tau"], start=1):
        fig.update_xaxes(title_text="step", row=1, col=col)
        fig.update_yaxes(title_text=label, row=1, col=col)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(template=TEMPLATE, title=dict(
        text="Training", subtitle=dict(text="simulated tau = 1 + sum_k prod_{i<=k} acc_i")))
    return fig
