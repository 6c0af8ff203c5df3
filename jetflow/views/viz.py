"""Figures of one drafted tree: its layout, the tree itself (a bare ``Tree`` or a decode round's, with its
accepted path), the attention masks (draft side and verify side) and the per-depth log-probs every builder
starts from.

Every function takes plain data and returns a ``go.Figure``; the pure helpers (``tree_layout``,
``draft_block_mask``, ``round_summary``) are public and tested, so a checked notebook cell can print what a
figure plots. Rounds and rows have figures of their own (``viz_rounds``, ``viz_rows``, ``viz_train``); the
colours and template are ``viz_style``'s.
"""
from __future__ import annotations

import html
from collections.abc import Sequence

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from jetflow.drafting.head import block_mask as draft_block_mask  # the mask the head really uses, not a copy
from jetflow.engine.tree import Tree, ancestor_mask
from .viz_style import EDGE, GREY, PATH, SCORE_SCALE, TEMPLATE, Decode, figure, node_text

def _label(token: int, decode: Decode | None) -> str:
    """Hover-safe token text: repr() shows whitespace and newlines, escape() keeps HTML inert."""
    return html.escape(repr(decode([token])), quote=False) if decode is not None else str(token)


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
                      textfont=dict(size=12, color="#222222"), cliponaxis=False,
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
    fig = figure(title or _tree_title(tree, round_or_tree, path, decode), height=tree_height(rows),
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
    accepted = len(path) - 1
    return (f"Round: {len(rnd.committed)} tokens committed ({accepted} accepted draft{'s' * (accepted != 1)} + bonus "
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
    fig = figure(f"Verify mask of the tree verified ({len(tree)} nodes)", "blue: may attend",
                  height=tree_height(len(tree)) + 60,
                  xaxis=dict(title=dict(text="key"), type="category", tickangle=-60, tickmode="array", tickvals=keys),
                  yaxis=dict(title=dict(text="query"), type="category", autorange="reversed", tickmode="array",
                             tickvals=names))
    fig.add_trace(_mask_heatmap(mask, keys, names))
    return fig


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
    fig = figure("Draft probabilities per depth (the builders' input)", "row d: the head's guess for depth d",
                  xaxis=dict(title=dict(text="token"), type="category", side="top"),
                  yaxis=dict(title=dict(text="depth"), autorange="reversed", dtick=1))
    fig.add_trace(go.Heatmap(z=z.tolist(), x=[node_text(c, decode) for c in cols],
                             y=list(range(1, probs.shape[0] + 1)), zmin=0, zmax=1, colorscale="Blues",
                             texttemplate="%{z:.2f}", showscale=False, xgap=2, ygap=2,
                             hovertemplate="depth %{y}, token %{x}<br>p = %{z:.3f}<extra></extra>"))
    # the token axis sits on top: room above it for the title and subtitle, so they do not overlap
    fig.update_layout(margin=dict(t=150), title=dict(y=0.98, yanchor="top"))
    return fig
