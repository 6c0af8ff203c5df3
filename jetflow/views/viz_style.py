"""The figures' one style: the conventions line, the colours (``PALETTE``: the one place a series, such as a
method, gets its colour), the inline plotly template, and the figure and token-label helpers every
``viz*`` module shares. Figures carry this small template instead of plotly's default one, which would add
~10 kB of JSON to every notebook output.
"""
from __future__ import annotations

import html
from collections.abc import Callable

import plotly.graph_objects as go

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


def colour(index: int) -> str:
    """The colour of the ``index``-th series of a figure (a method, a head, a depth): ``PALETTE`` round and round."""
    return PALETTE[index % len(PALETTE)]


def figure(title: str, subtitle: str | None = None, **layout) -> go.Figure:
    """An empty figure in the template, with its title and subtitle."""
    return go.Figure(layout=dict(template=TEMPLATE, title=dict(text=title, subtitle=dict(text=subtitle)),
                                 **layout))


def node_text(token: int, decode: Decode | None, limit: int = 10) -> str:
    """A node's on-figure label: the token's text with whitespace made visible (space = "·",
    newline = "⏎"), cut to ``limit`` characters, HTML-escaped (plotly renders a little HTML). A token with
    no letter or digit (``.``, ``,``, a lone space) is quoted, ``'.'``, so it is not a speck on the figure."""
    text = decode([token]) if decode is not None else str(token)
    text = text.replace(" ", "·").replace("\n", "⏎").replace("\t", "⇥")
    if text and not any(ch.isalnum() for ch in text):
        text = f"'{text}'"
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return html.escape(text, quote=False)
