"""Figures for notebooks and widgets: every function takes plain data and returns a ``go.Figure``.

Inputs are trees, decode rounds (``decode.Round``: anything with ``tree``, ``path``, ``committed``,
``target_choice``), results (anything with ``rounds``) or benchmark/training rows (dicts). Nothing
here loads a model or computes a number that a figure then hides: the pure helpers
(``tree_layout``, ``branch_acceptance``, ``draft_block_mask``) are public and tested, so a checked
notebook cell can print what a figure plots. Figures carry a small inline template instead of
plotly's default one, which would add ~10 kB of JSON to every notebook output.
"""
from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from jetflow.drafting.head import block_mask as draft_block_mask  # the mask the head really uses, not a copy
from jetflow.engine.tree import Tree, ancestor_mask

CONVENTIONS = ("tau = mean tokens committed per round incl. the bonus token; "
               "budget = draft nodes excluding the root")
GREY = "#c8c8c8"        # rejected / never-reached draft nodes
EDGE = "#b0b0b0"        # every parent -> child edge
PATH = "#d62728"        # the accepted path: edges and node outlines
SCORE_SCALE = "Viridis"
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
TEMPLATE = go.layout.Template(layout=dict(
    plot_bgcolor="white", font=dict(size=12), hovermode="closest",
    xaxis=dict(gridcolor="#eeeeee", zeroline=False), yaxis=dict(gridcolor="#eeeeee", zeroline=False)))

Decode = Callable[[list[int]], str]


def _figure(title: str, subtitle: str | None = None, **layout) -> go.Figure:
    return go.Figure(layout=dict(template=TEMPLATE, title=dict(text=title, subtitle=dict(text=subtitle)),
                                 **layout))


def _label(token: int, decode: Decode | None) -> str:
    """Hover-safe token text: repr() shows whitespace and newlines, escape() keeps HTML inert."""
    return html.escape(repr(decode([token])), quote=False) if decode is not None else str(token)


def node_text(token: int, decode: Decode | None, limit: int = 10) -> str:
    """A node's on-figure label: the token's text with whitespace made visible (space = "·",
    newline = "⏎"), cut to ``limit`` characters, HTML-escaped (plotly renders a little HTML)."""
    text = decode([token]) if decode is not None else str(token)
    text = text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥")
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return html.escape(text, quote=False)


def _rounds(rounds) -> list:
    return list(rounds.rounds) if hasattr(rounds, "rounds") else list(rounds)


# ----------------------------------------------------------------------------- trees
def tree_layout(tree: Tree) -> tuple[list[float], list[float]]:
    """(x, y) per node: x = depth; y = a tidy layout where leaves take consecutive rows in
    depth-first order (children in insertion order) and a parent sits midway between its first
    and last child. Nodes at one depth keep their depth-first order, and siblings stay adjacent."""
    kids = tree.children()
    y = [0.0] * len(tree)
    stack, row = [0], 0
    while stack:  # depth-first preorder; leaves take the next free row
        node = stack.pop()
        if not kids[node]:
            y[node], row = float(row), row + 1
        stack.extend(reversed(kids[node]))
    for node in range(len(tree) - 1, -1, -1):  # children have larger indices than their parent
        if kids[node]:
            y[node] = (y[kids[node][0]] + y[kids[node][-1]]) / 2
    return [float(d) for d in tree.depth.tolist()], y


def _edges(x, y, pairs) -> tuple[list, list]:
    ex, ey = [], []
    for p, c in pairs:
        ex += [x[p], x[c], None]
        ey += [y[p], y[c], None]
    return ex, ey


def _nodes(name, idx, x, y, hover, marker, text=None) -> go.Scatter:
    """Node markers; with ``text`` (one label per tree node) each marker carries its label above it.
    ``mode`` and ``text`` are always set, so a FigureWidget updated from this trace never keeps stale labels."""
    return go.Scatter(x=[x[i] for i in idx], y=[y[i] for i in idx], name=name, customdata=idx,
                      mode="markers" if text is None else "markers+text",
                      text=None if text is None else [text[i] for i in idx], textposition="top center",
                      textfont=dict(size=10, color="#333333"), cliponaxis=False,
                      hovertext=[hover[i] for i in idx], hoverinfo="text", marker=marker)


def tree_height(rows: int) -> int:
    """Figure height in pixels for a tree of ``rows`` leaves: ~26 px a row, between 360 and 1200."""
    return min(1200, max(360, 26 * rows + 160))


LABEL_LIMIT = 80  # trees up to this many nodes carry token text on every node (bigger ones: hover only)


def tree_figure(round_or_tree, *, decode: Decode | None = None, target_choice: Sequence[int] | None = None,
                title: str | None = None, labels: bool | None = None) -> go.Figure:
    """One candidate tree: x = depth, y = tidy rank, edges parent -> child, nodes coloured by
    cumulative draft log-prob. Given a Round, its accepted path (``Round.path``) is drawn as thick
    edges and outlined coloured nodes (trace "accepted") and every other node is grey (trace
    "rejected"); a bare Tree gets one coloured trace "nodes". Each node trace's ``customdata``
    holds node indices. Hover: token, log-prob, depth and the target's own choice at that node
    (``target_choice`` overrides ``Round.target_choice``). ``decode(list[int]) -> str`` renders ids.
    ``labels``: token text on every node (``node_text``); default on for trees of at most
    ``LABEL_LIMIT`` nodes.
    """
    is_tree = isinstance(round_or_tree, Tree)
    tree = round_or_tree if is_tree else round_or_tree.tree
    path = None if is_tree else list(round_or_tree.path)
    choice = target_choice if target_choice is not None else (None if is_tree else round_or_tree.target_choice)
    if choice is not None and len(choice) != len(tree):
        raise ValueError(f"target_choice has {len(choice)} entries for a tree of {len(tree)} nodes")
    x, y = tree_layout(tree)
    tokens, parents, score = tree.tokens.tolist(), tree.parents.tolist(), tree.score.tolist()
    labels = len(tree) <= LABEL_LIMIT if labels is None else labels
    text = [node_text(t, decode) for t in tokens] if labels else None
    hover = []
    for i, tok in enumerate(tokens):
        lines = [("anchor " if i == 0 else "") + _label(tok, decode),
                 f"log-prob {score[i]:.3f}", f"depth {int(x[i])}, node {i}"]
        if choice is not None:
            lines.append(f"target: {_label(choice[i], decode)}")
        hover.append("<br>".join(lines))
    size = 12 if len(tree) <= 64 else 7
    symbols = ["square" if i == 0 else "circle" for i in range(len(tree))]
    colour = dict(colorscale=SCORE_SCALE, colorbar=dict(title=dict(text="cum. log-prob")),
                  cmin=min(score), cmax=max(score)) if max(score) > min(score) else dict(colorscale=SCORE_SCALE)

    rows = int(max(y)) + 1  # leaves, one per row: room for a label on each
    fig = _figure(title or _tree_title(tree, round_or_tree, path, decode), height=tree_height(rows),
                  xaxis=dict(title=dict(text="depth"), dtick=1),
                  yaxis=dict(autorange="reversed", showticklabels=False, showgrid=False))
    ex, ey = _edges(x, y, [(p, c) for c, p in enumerate(parents) if p >= 0])
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", name="edges", line=dict(color=EDGE, width=1),
                             hoverinfo="skip", showlegend=False))
    if path is None:
        idx = list(range(len(tree)))
        fig.add_trace(_nodes("nodes", idx, x, y, hover, dict(
            size=size, symbol=symbols, color=score, line=dict(color="white", width=1), **colour), text))
        fig.update_traces(showlegend=False, selector=dict(name="nodes"))  # one trace: the colour bar says it all
        return fig
    fig.update_layout(legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="left", x=0))  # clear of the colour bar
    ex, ey = _edges(x, y, zip(path[:-1], path[1:]))
    fig.add_trace(go.Scatter(x=ex, y=ey, mode="lines", name="accepted path", line=dict(color=PATH, width=4),
                             hoverinfo="skip"))
    on_path = set(path)
    rejected = [i for i in range(len(tree)) if i not in on_path]
    fig.add_trace(_nodes("rejected", rejected, x, y, hover, dict(
        size=size, color=GREY, symbol=[symbols[i] for i in rejected], line=dict(color="white", width=1)), text))
    fig.add_trace(_nodes("accepted", path, x, y, hover, dict(
        size=size + 4, color=[score[i] for i in path], symbol=[symbols[i] for i in path],
        line=dict(color=PATH, width=3), **colour), text))
    return fig


def _tree_title(tree: Tree, rnd, path, decode: Decode | None) -> str:
    if path is None:
        return f"Candidate tree: budget {tree.budget}, depth {int(tree.depth.max())}"
    bonus = _label(rnd.target_choice[path[-1]], decode)
    return (f"Round: {len(rnd.committed)} tokens committed ({len(path) - 1} accepted drafts + bonus "
            f"{bonus}), budget {tree.budget}")


def render_round(result, round_index: int, decode: Decode | None = None) -> go.Figure:
    """``tree_figure`` of ``result.rounds[round_index]``: the pure core of a round-browsing widget."""
    n = len(result.rounds)
    if not 0 <= round_index < n:
        raise IndexError(f"round_index must be in [0, {n}), got {round_index}")
    rnd = result.rounds[round_index]
    title = (f"Round {round_index + 1}/{n}: {len(rnd.committed)} committed "
             f"({rnd.accepted} accepted + bonus), budget {rnd.tree.budget}")
    return tree_figure(rnd, decode=decode, title=title)


def round_summary(result, round_index: int) -> dict:
    """The numbers ``render_round(result, round_index)`` draws: round (0-based) of rounds, draft nodes
    (root excluded), deepest depth, accepted drafts and tokens committed (accepted + bonus)."""
    n = len(result.rounds)
    if not 0 <= round_index < n:
        raise IndexError(f"round_index must be in [0, {n}), got {round_index}")
    rnd = result.rounds[round_index]
    return {"round": round_index, "rounds": n, "nodes": rnd.tree.budget, "depth": int(rnd.tree.depth.max()),
            "accepted": rnd.accepted, "committed": len(rnd.committed)}


# ----------------------------------------------------------------------------- masks
def _mask_heatmap(mask: torch.Tensor, xs: list[str], ys: list[str]) -> go.Heatmap:
    return go.Heatmap(z=mask.int().tolist(), x=xs, y=ys, zmin=0, zmax=1, showscale=False, xgap=1, ygap=1,
                      colorscale=[[0, "#f2f2f2"], [1, "#1f77b4"]],
                      hovertemplate="query %{y}<br>key %{x}<br>attend %{z}<extra></extra>")


def masks_figure(block_size: int = 8, n_ctx: int = 4, tree: Tree | None = None) -> go.Figure:
    """Draft-side block masks (queries = block slots s*, keys = context rows c* + block slots),
    JetFlow's causal one next to DFlash's bidirectional one; with ``tree``, also the verify-side
    ancestor mask (node i may see node j). Blue = may attend."""
    if block_size < 1 or n_ctx < 0:
        raise ValueError(f"need block_size >= 1 and n_ctx >= 0, got {block_size} and {n_ctx}")
    titles = ["JetFlow draft: causal block", "DFlash draft: bidirectional block"]
    if tree is not None:
        titles.append(f"Verify: tree ancestor mask ({len(tree)} nodes)")
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles, horizontal_spacing=0.08)
    slots = [f"s{j}" for j in range(block_size)]
    keys = [f"c{j}" for j in range(n_ctx)] + slots
    for col, causal in ((1, True), (2, False)):
        fig.add_trace(_mask_heatmap(draft_block_mask(n_ctx, block_size, causal), keys, slots), row=1, col=col)
        fig.update_xaxes(title_text="key (context rows, block slots)", row=1, col=col)
        fig.update_yaxes(title_text="query (block slot)", autorange="reversed", row=1, col=col)
    if tree is not None:
        nodes = [str(i) for i in range(len(tree))]
        fig.add_trace(_mask_heatmap(ancestor_mask(tree.parents), nodes, nodes), row=1, col=3)
        fig.update_xaxes(title_text="key (tree node)", type="category", row=1, col=3)
        fig.update_yaxes(title_text="query (tree node)", type="category", autorange="reversed", row=1, col=3)
    fig.update_layout(template=TEMPLATE, title=dict(text="Attention masks"))
    return fig


# ----------------------------------------------------------------------------- acceptance
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
    fig = _figure("Acceptance by depth and sibling rank", CONVENTIONS,
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
    fig = _figure(f"Tokens committed per round: tau = {tau:.2f} over {len(taus)} rounds", CONVENTIONS,
                  xaxis=dict(title=dict(text="tokens committed in a round"), dtick=1),
                  yaxis=dict(title=dict(text="rounds")))
    fig.add_trace(go.Bar(x=ks, y=[taus.count(k) for k in ks], name="rounds", marker=dict(color=PALETTE[0])))
    fig.add_vline(x=tau, line=dict(color=PATH, dash="dash"))
    return fig


def tokens_per_round(rounds) -> go.Figure:
    """Tokens committed in each round (markers + line) and the running mean tau (dashed)."""
    taus = _committed(rounds)
    running = [sum(taus[:i + 1]) / (i + 1) for i in range(len(taus))]
    fig = _figure("Tokens committed per round", CONVENTIONS, xaxis=dict(title=dict(text="round")),
                  yaxis=dict(title=dict(text="tokens committed")))
    fig.add_trace(go.Scatter(x=list(range(len(taus))), y=taus, mode="lines+markers", name="committed",
                             line=dict(color=PALETTE[0])))
    fig.add_trace(go.Scatter(x=list(range(len(taus))), y=running, mode="lines", name="running tau",
                             line=dict(color=PATH, dash="dash")))
    return fig


# ----------------------------------------------------------------------------- benchmarks, training
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
    methods = list(dict.fromkeys(m for m, _ in series))
    datasets = list(dict.fromkeys(d for _, d in series))
    budgets = sorted({b for pts in series.values() for b in pts})
    fig = _figure(f"{y} against draft budget", CONVENTIONS, height=max(450, 22 * len(series) + 160),  # legend fits
                  xaxis=dict(title=dict(text="budget (draft nodes, root excluded)"), type="log",
                             tickvals=budgets, ticktext=[str(b) for b in budgets]),
                  yaxis=dict(title=dict(text=y)), legend=dict(title=dict(text="method")))
    for (method, dataset), pts in series.items():
        xs = sorted(pts)
        name = method if len(datasets) == 1 or dataset is None else f"{method} / {dataset}"
        fig.add_trace(go.Scatter(
            x=xs, y=[pts[b] for b in xs], mode="lines+markers", name=name,
            line=dict(color=PALETTE[methods.index(method) % len(PALETTE)],
                      dash=DASHES[datasets.index(dataset) % len(DASHES)])))
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
                                 line=dict(color=PALETTE[j % len(PALETTE)])), row=1, col=2)
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


# ----------------------------------------------------------------------------- one round, stage by stage
def logp_table(logp: torch.Tensor, decode: Decode | None = None, top: int | None = None) -> go.Figure:
    """Per-depth draft probabilities as a table-like heatmap: row d = depth d, one column per token
    (``top``: only the tokens that are among the ``top`` most likely at some depth), each cell printing
    its probability. The input of every tree builder (``logp`` (D, V) log-probs)."""
    if logp.dim() != 2:
        raise ValueError(f"logp must be (depths, vocab), got shape {tuple(logp.shape)}")
    probs = logp.float().exp()
    cols = list(range(probs.shape[1])) if top is None else sorted(
        set(probs.topk(min(top, probs.shape[1]), dim=-1).indices.flatten().tolist()))
    z = probs[:, cols]  # (D, C)
    fig = _figure("Draft probabilities per depth (the builders' input)", "row d: the head's guess for depth d",
                  xaxis=dict(title=dict(text="token"), type="category", side="top"),
                  yaxis=dict(title=dict(text="depth"), autorange="reversed", dtick=1))
    fig.add_trace(go.Heatmap(z=z.tolist(), x=[node_text(c, decode) for c in cols],
                             y=list(range(1, probs.shape[0] + 1)), zmin=0, zmax=1, colorscale="Blues",
                             texttemplate="%{z:.2f}", showscale=False, xgap=2, ygap=2,
                             hovertemplate="depth %{y}, token %{x}<br>p = %{z:.3f}<extra></extra>"))
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
    fig = _figure("Verification along the accepted path", "❌ rows: what the target wrote instead; "
                  "⭐ the bonus token", height=170 + 24 * len(rows))
    fig.add_trace(go.Table(header=dict(values=cols, fill_color="#eeeeee", align="left"),
                           cells=dict(values=cells, fill_color=fill, align="left")))
    return fig


def tree_mask(tree: Tree, decode: Decode | None = None, past_len: int = 0) -> go.Figure:
    """The verify mask of ``tree`` with token text on both axes: query node i may attend key node j
    (its ancestors and itself); every node also sees all ``past_len`` cached prefix rows (one column
    "prefix", drawn only when ``past_len`` > 0)."""
    names = [f"{i}:{node_text(t, decode, 8)}" for i, t in enumerate(tree.tokens.tolist())]
    mask = ancestor_mask(tree.parents)  # (N+1, N+1)
    keys = names
    if past_len:
        mask = torch.cat([torch.ones(len(tree), 1, dtype=torch.bool), mask], dim=1)
        keys = [f"prefix ({past_len})"] + names
    fig = _figure(f"Verify mask of the tree verified ({len(tree)} nodes)", "blue: may attend",
                  height=tree_height(len(tree)) + 60,
                  xaxis=dict(title=dict(text="key"), type="category", tickangle=-60, tickmode="array", tickvals=keys),
                  yaxis=dict(title=dict(text="query"), type="category", autorange="reversed", tickmode="array",
                             tickvals=names))
    fig.add_trace(_mask_heatmap(mask, keys, names))
    return fig


def verify_cost(cost_by_size: dict[int, float], draft_s: float | None = None) -> go.Figure:
    """Seconds of one verify step against the tokens verified (budget + 1), from
    ``budget.measure_verify_cost``, on log-log axes; ``draft_s`` (one draft pass) as a dashed line."""
    if not cost_by_size:
        raise ValueError("verify_cost needs at least one measured size")
    ks = sorted(cost_by_size)
    fig = _figure("Cost side: verify time against tree size", "on a GPU this stays nearly flat; on a CPU it grows",
                  xaxis=dict(title=dict(text="tokens verified (budget + 1)"), type="log",
                             tickvals=ks, ticktext=[str(k) for k in ks]),
                  yaxis=dict(title=dict(text="ms per step"), type="log"))
    fig.add_trace(go.Scatter(x=ks, y=[1000 * cost_by_size[k] for k in ks], mode="lines+markers",
                             name="verify", line=dict(color=PALETTE[0])))
    if draft_s is not None:
        fig.add_trace(go.Scatter(x=[ks[0], ks[-1]], y=[1000 * draft_s] * 2, mode="lines", name="draft (one pass)",
                                 line=dict(color=PALETTE[1], dash="dash")))
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
    fig = _figure(f"First committed token, {n} sampled rounds vs the target's distribution", CONVENTIONS,
                  xaxis=dict(title=dict(text="token"), type="category"), yaxis=dict(title=dict(text="probability")),
                  barmode="group")
    fig.add_trace(go.Bar(x=names, y=[observed[i] / n for i in ids], name="sample-and-match",
                         marker=dict(color=PALETTE[0])))
    fig.add_trace(go.Bar(x=names, y=[expected[i] for i in ids], name="target softmax(logits / T)",
                         marker=dict(color=PALETTE[1])))
    return fig


# ----------------------------------------------------------------------------- reading result rows
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
