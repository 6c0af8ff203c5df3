"""Figures of decode rounds: acceptance by depth and sibling rank, tokens committed per round (histogram and
series), one round's verification table, and sample-and-match's first token against the target's
distribution. Inputs: ``decode.Round``s (anything with ``tree``, ``path``, ``committed``), a ``Result``
(anything with ``rounds``) or the plain rows and counts of ``views.walkthrough``.
"""
from __future__ import annotations

from collections.abc import Sequence

import plotly.graph_objects as go
import torch

from .viz_style import CONVENTIONS, PALETTE, PATH, SCORE_SCALE, Decode, figure, node_text


def _rounds(rounds) -> list:
    return list(rounds.rounds) if hasattr(rounds, "rounds") else list(rounds)


def branch_acceptance(rounds) -> tuple[torch.Tensor, torch.Tensor]:
    """(attempts, accepts), both (D, W) long; row d-1 is depth d, column r the sibling rank
    (insertion order, which is score order for our builders). A node is attempted when its parent
    is on the accepted path, i.e. the target compared it with its own choice; it is accepted when
    it is on the path. ``rounds``: Rounds (anything with ``tree`` and ``path``) or a Result."""
    rounds = _rounds(rounds)
    hits = []  # (depth, rank, accepted) per attempted node
    for rnd in rounds:
        kids, depth, path = rnd.tree.children(), rnd.tree.depth.tolist(), set(rnd.path)
        for node in rnd.path:
            hits += [(depth[c], r, c in path) for r, c in enumerate(kids[node])]
    d_max = max((h[0] for h in hits), default=0)
    w_max = max((h[1] + 1 for h in hits), default=0)
    attempts = torch.zeros(d_max, w_max, dtype=torch.long)
    accepts = torch.zeros(d_max, w_max, dtype=torch.long)
    for d, r, ok in hits:
        attempts[d - 1, r] += 1
        accepts[d - 1, r] += int(ok)
    return attempts, accepts


def acceptance_heatmap(rounds, max_depth: int | None = None, max_rank: int | None = None) -> go.Figure:
    """Acceptance rate per (depth, sibling rank) over ``rounds``; cells never attempted are empty.
    Hover and ``customdata`` carry [accepts, attempts]."""
    attempts, accepts = branch_acceptance(rounds)
    attempts, accepts = attempts[:max_depth, :max_rank], accepts[:max_depth, :max_rank]
    rate = [[a / n if n else None for a, n in zip(ra, rn)] for ra, rn in zip(accepts.tolist(), attempts.tolist())]
    fig = figure("Acceptance by depth and sibling rank", CONVENTIONS,
                  xaxis=dict(title=dict(text="sibling rank (0 = highest draft score)"), dtick=1),
                  yaxis=dict(title=dict(text="depth"), dtick=1, autorange="reversed"))
    fig.add_trace(go.Heatmap(
        z=rate, x=list(range(attempts.shape[1])), y=list(range(1, attempts.shape[0] + 1)), zmin=0, zmax=1,
        colorscale=SCORE_SCALE, colorbar=dict(title=dict(text="accept rate")), texttemplate="%{z:.2f}",
        customdata=torch.stack([accepts, attempts], dim=-1).tolist(),
        hovertemplate="depth %{y}, rank %{x}<br>accepted %{customdata[0]} / %{customdata[1]}"
                      "<br>rate %{z:.2f}<extra></extra>"))
    return fig


def _committed(rounds_or_taus) -> list[int]:
    items = _rounds(rounds_or_taus)
    return [int(r) if isinstance(r, (int, float)) else len(r.committed) for r in items]


def tau_histogram(rounds_or_taus) -> go.Figure:
    """Bar chart of tokens committed per round (counted here, so the bars are exact integers) with
    a dashed line at the mean (tau). Takes Rounds, a Result, or plain per-round counts."""
    taus = _committed(rounds_or_taus)
    if not taus:
        raise ValueError("tau_histogram needs at least one round")
    ks = list(range(min(taus), max(taus) + 1))
    tau = sum(taus) / len(taus)
    fig = figure(f"Tokens committed per round: tau = {tau:.2f} over {len(taus)} rounds", CONVENTIONS,
                  xaxis=dict(title=dict(text="tokens committed in a round"), dtick=1),
                  yaxis=dict(title=dict(text="rounds")))
    fig.add_trace(go.Bar(x=ks, y=[taus.count(k) for k in ks], name="rounds", marker=dict(color=PALETTE[0])))
    fig.add_vline(x=tau, line=dict(color=PATH, dash="dash"))
    return fig


def tokens_per_round(rounds) -> go.Figure:
    """Tokens committed in each round (markers + line) and the running mean tau (dashed)."""
    taus = _committed(rounds)
    running = [sum(taus[:i + 1]) / (i + 1) for i in range(len(taus))]
    fig = figure("Tokens committed per round", CONVENTIONS, xaxis=dict(title=dict(text="round")),
                  yaxis=dict(title=dict(text="tokens committed")))
    fig.add_trace(go.Scatter(x=list(range(len(taus))), y=taus, mode="lines+markers", name="committed",
                             line=dict(color=PALETTE[0])))
    fig.add_trace(go.Scatter(x=list(range(len(taus))), y=running, mode="lines", name="running tau",
                             line=dict(color=PATH, dash="dash")))
    return fig


def acceptance_table(rows: Sequence[dict]) -> go.Figure:
    """A ✅/❌ table of one round's verification (rows of ``walkthrough.acceptance_rows``): every
    drafted child of an accepted node, whether the target took it, and the target's own choice there."""
    if not rows:
        raise ValueError("acceptance_table needs at least one row")
    cols = ["depth", "drafted", "verdict", "target chose"]
    cells = [[str(r[c]) for r in rows] for c in ("depth", "drafted", "verdict", "target")]
    fill = [["#e8f5e9" if r["verdict"] == "✅" else "#fdecea" if r["verdict"] == "❌" else "#fff8e1"
             for r in rows]] * len(cols)
    fig = figure("Verification along the accepted path", "❌ rows: what the target wrote instead; "
                  "⭐ the bonus token", height=170 + 24 * len(rows))
    fig.add_trace(go.Table(header=dict(values=cols, fill_color="#eeeeee", align="left"),
                           cells=dict(values=cells, fill_color=fill, align="left")))
    return fig


def distribution_check(observed: Sequence[int], expected: Sequence[float], decode: Decode | None = None,
                       top: int = 8) -> go.Figure:
    """Bars of how often each token came first out of sample-and-match (``observed`` counts per token id)
    beside the target's own probability (``expected``) for the ``top`` most likely tokens."""
    if len(observed) != len(expected):
        raise ValueError(f"observed has {len(observed)} entries, expected {len(expected)}")
    n = sum(observed)
    if n == 0:
        raise ValueError("distribution_check needs at least one draw")
    ids = sorted(range(len(expected)), key=lambda i: -expected[i])[:top]
    names = [node_text(i, decode) for i in ids]
    fig = figure(f"First committed token, {n} sampled rounds vs the target's distribution", CONVENTIONS,
                  xaxis=dict(title=dict(text="token"), type="category"), yaxis=dict(title=dict(text="probability")),
                  barmode="group")
    fig.add_trace(go.Bar(x=names, y=[observed[i] / n for i in ids], name="sample-and-match",
                         marker=dict(color=PALETTE[0])))
    fig.add_trace(go.Bar(x=names, y=[expected[i] for i in ids], name="target softmax(logits / T)",
                         marker=dict(color=PALETTE[1])))
    return fig
