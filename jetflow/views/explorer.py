"""The tree explorer (notebook 03): draft on demand for a typed prompt, two methods side by side.

    explorer = TreeExplorer(target, {"jetflow": p1, "ddtree": p2, ...}, decode=target.decode)
    explorer                                   # in a notebook: the widget
    explorer.controls["budget"].value = 32     # what a slider move does: both sides redraft
    explorer.click("left", 3)                  # what a click on node 3 does
    explorer.summary("left")                   # what is on screen, as numbers and text

Every change of prompt, method, budget or width decodes the prompt (``max_new_tokens``, greedy)
with each side's method, cached per setting; the round slider browses the rounds. Each side is a
plotly ``FigureWidget`` whose traces are updated in place (never a fresh figure), a text panel (the
prompt, the answer so far, what this round committed) and a node panel: clicking a node shows its
path from the root, the target's top choices there (``walkthrough.round_logits``) and its verify-mask
row, which the tree also rings. ``width`` applies to the Algorithm 1 methods (``jetflow``, ``+lookup``).
"""
from __future__ import annotations

import dataclasses
import html

from jetflow.views import viz
from jetflow.engine.decode import generate
from .viz_style import TEMPLATE
from .walkthrough import node_info, round_logits

SIDES = ("left", "right")
TRACES = ("edges", "accepted path", "rejected", "accepted", "mask row")  # the fixed traces of each side
ACCEPTED = "#ffd92f"  # accepted nodes' fill (outlined in viz_style.PATH)


def uses_width(proposer) -> bool:
    """Whether Algorithm 1's width changes what ``proposer`` drafts."""
    inner = getattr(proposer, "inner", proposer)  # LookupMerged wraps a head proposer
    return getattr(inner, "builder", None) == "accum_logp"


def with_width(proposer, width: int):
    """``proposer`` with Algorithm 1's width set to ``width`` (a copy; unchanged when it has none)."""
    if hasattr(proposer, "inner"):  # LookupMerged around a head proposer
        return dataclasses.replace(proposer, inner=with_width(proposer.inner, width))
    if getattr(proposer, "builder", None) == "accum_logp" and proposer.width != width:
        return dataclasses.replace(proposer, width=width)
    return proposer


def round_html(result, round_index: int, decode, prompt: str) -> str:
    """The text panel: the prompt, the answer before this round, and (highlighted) what it committed."""
    before = sum(len(r.committed) for r in result.rounds[:round_index])
    rnd = result.rounds[round_index]
    esc = lambda ids: html.escape(decode(ids))  # noqa: E731
    so_far = esc(result.tokens[:before + 1])  # the anchor (last committed token) included
    return (f"<b>prompt</b>: {html.escape(prompt)}<br><b>answer so far</b>: {so_far}"
            f"<mark title='committed this round'>{esc(rnd.committed)}</mark><br>"
            f"<b>this round</b>: {rnd.accepted} accepted + bonus = {len(rnd.committed)} tokens "
            f"<code>{html.escape(repr(decode(rnd.committed)))}</code>; tau of the answer {result.tau:.2f}")


def node_html(info: dict | None) -> str:
    """The node panel for ``walkthrough.node_info`` output (None: nothing clicked yet)."""
    if info is None:
        return "<i>click a node: its path, the target's top choices there and its mask row</i>"
    top = ", ".join(f"{html.escape(t)} {p:.2f}" for t, p in info["top"])
    return (f"<b>node {info['node']}</b> (depth {info['depth']}) path: {html.escape(' → '.join(info['path_text']))}"
            f"<br><b>target's top choices next</b>: {top}"
            f"<br><b>mask row</b>: attends nodes {info['mask_row']} (its ancestors and itself) + the whole prefix")


def _flat(trace: dict) -> dict:
    """A tree_figure trace for an in-place update: no type, and accepted nodes in one colour instead of a
    colour scale (colour bars stack up when a FigureWidget restyles them; hover still shows the score)."""
    trace = {k: v for k, v in trace.items() if k != "type"}
    marker = trace.get("marker")
    if marker and "colorscale" in marker:
        trace["marker"] = {k: v for k, v in marker.items() if k not in ("colorscale", "colorbar", "cmin", "cmax")}
        trace["marker"]["color"] = ACCEPTED
    return trace


class TreeExplorer:
    """Controls ``prompt`` (Textarea), ``left`` / ``right`` (methods), ``budget``, ``width`` and
    ``round``; views per side in ``figures``, ``texts`` and ``nodes``. See the module docstring."""

    def __init__(self, target, proposers: dict, *, decode=None, prompt: str = "Write a haiku about the sea.",
                 methods: tuple[str, str] | None = None, budgets=(4, 8, 16, 32, 64), budget: int = 16,
                 width: int = 7, max_new_tokens: int = 32, top: int = 5):
        import ipywidgets as widgets
        import plotly.graph_objects as go
        if len(proposers) < 1:
            raise ValueError("TreeExplorer needs at least one proposer")
        if budget not in budgets:
            raise ValueError(f"budget {budget} is not one of the budgets {tuple(budgets)}")
        names = list(proposers)
        methods = methods or (names[0], names[min(1, len(names) - 1)])
        if any(m not in proposers for m in methods):
            raise ValueError(f"methods {methods} must be among the proposers {names}")
        self.target, self.proposers, self.decode = target, dict(proposers), decode or target.decode
        self.max_new_tokens, self.top = max_new_tokens, top
        self.results, self.selected, self._logits = {}, {s: None for s in SIDES}, {}
        self.controls = {
            "prompt": widgets.Textarea(value=prompt, description="prompt", continuous_update=False,
                                       layout=widgets.Layout(width="95%")),
            "left": widgets.Dropdown(options=names, value=methods[0], description="left"),
            "right": widgets.Dropdown(options=names, value=methods[1], description="right"),
            "budget": widgets.SelectionSlider(options=list(budgets), value=budget, description="budget"),
            "width": widgets.IntSlider(value=width, min=1, max=10, description="width"),
            "round": widgets.IntSlider(value=0, min=0, max=0, description="round"),
        }
        self.figures = {s: go.FigureWidget(layout=dict(template=TEMPLATE, height=420, width=560,
                                                       margin=dict(l=20, r=20, t=60, b=40)))
                        for s in SIDES}
        self.texts = {s: widgets.HTML() for s in SIDES}
        self.nodes = {s: widgets.HTML() for s in SIDES}
        for side, fig in self.figures.items():
            for name in TRACES:
                fig.add_scatter(x=[], y=[], name=name)
            for k in (2, 3):  # rejected and accepted nodes take clicks
                fig.data[k].on_click(lambda trace, points, state, side=side: self._on_click(side, trace, points))
        for name in ("prompt", "left", "right", "budget", "width"):
            self.controls[name].observe(self._on_setting, names="value")
        self.controls["round"].observe(lambda change: self._redraw(), names="value")
        c = self.controls
        panes = [widgets.VBox([self.figures[s], self.texts[s], self.nodes[s]],
                              layout=widgets.Layout(width="50%")) for s in SIDES]
        self.box = widgets.VBox([c["prompt"], widgets.HBox([c["left"], c["right"]]),
                                 widgets.HBox([c["budget"], c["width"], c["round"]]), widgets.HBox(panes)])
        self._on_setting()

    # ------------------------------------------------------------------ state
    def _key(self, side: str) -> tuple:
        """(prompt, method, budget, width); width None for a method it does not change."""
        c = self.controls
        proposer = self.proposers[c[side].value]
        return (c["prompt"].value, c[side].value, c["budget"].value,
                c["width"].value if uses_width(proposer) else None)

    def result(self, side: str):
        """The decode Result shown on ``side``, decoding it first if this setting is new."""
        key = self._key(side)
        if key not in self.results:
            prompt, method, budget, width = key
            proposer = self.proposers[method] if width is None else with_width(self.proposers[method], width)
            self.results[key] = generate(self.target, prompt, proposer, budget=budget,
                                         max_new_tokens=self.max_new_tokens)
        return self.results[key]

    def round_index(self, side: str) -> int:
        """The round shown on ``side``: the slider's value, clamped to that side's rounds."""
        return min(self.controls["round"].value, len(self.result(side).rounds) - 1)

    def info(self, side: str) -> dict | None:
        """``walkthrough.node_info`` of the node clicked on ``side`` (None when none is selected)."""
        node = self.selected[side]
        if node is None:
            return None
        key = (self._key(side), self.round_index(side))
        if key not in self._logits:
            self._logits[key] = round_logits(self.target, self.result(side), key[1])
        tree = self.result(side).rounds[key[1]].tree
        return node_info(tree, self._logits[key], node, self.decode, self.top)

    def summary(self, side: str = "left") -> dict:
        """What ``side`` shows: method, budget, width, ``viz.round_summary`` fields, the text committed
        this round and the selected node's info (None when nothing is clicked)."""
        result, r = self.result(side), self.round_index(side)
        _, method, budget, width = self._key(side)
        return {"method": method, "budget": budget, "width": width, **viz.round_summary(result, r),
                "committed_text": self.decode(result.rounds[r].committed), "node": self.info(side)}

    # ------------------------------------------------------------------ events
    def click(self, side: str, node: int) -> None:
        """Select ``node`` on ``side`` as a click on it does."""
        if side not in SIDES:
            raise ValueError(f"side must be one of {SIDES}, got {side!r}")
        n = len(self.result(side).rounds[self.round_index(side)].tree)
        if not 0 <= node < n:
            raise IndexError(f"node must be in [0, {n}), got {node}")
        self.selected[side] = node
        self._draw(side)

    def _on_click(self, side: str, trace, points) -> None:
        if points.point_inds:
            self.click(side, int(trace.customdata[points.point_inds[0]]))

    def _on_setting(self, change=None) -> None:
        self.selected = {s: None for s in SIDES}
        rounds = max(len(self.result(s).rounds) for s in SIDES)
        with self.controls["round"].hold_trait_notifications():
            self.controls["round"].max = rounds - 1
        self._redraw()

    def _redraw(self) -> None:
        for side in SIDES:
            self._draw(side)

    def _draw(self, side: str) -> None:
        result, r = self.result(side), self.round_index(side)
        _, method, budget, _ = self._key(side)
        fig = viz.render_round(result, r, self.decode)
        info = self.info(side) if self.selected[side] is not None and \
            self.selected[side] < len(result.rounds[r].tree) else None
        widget = self.figures[side]
        with widget.batch_update():
            for trace, new in zip(widget.data, fig.data):
                trace.update(_flat(new.to_plotly_json()))
            x, y = viz.tree_layout(result.rounds[r].tree)
            ring = info["mask_row"] if info else []
            widget.data[4].update(x=[x[i] for i in ring], y=[y[i] for i in ring], mode="markers", hoverinfo="skip",
                                  marker=dict(size=24, color="rgba(0,0,0,0)", line=dict(color="#ff7f0e", width=3)))
            widget.layout.update(title=dict(text=f"{method} @ {budget}: " + fig.layout.title.text, font=dict(size=12)),
                                 height=min(700, fig.layout.height),
                                 xaxis=fig.layout.xaxis, yaxis=fig.layout.yaxis, legend=fig.layout.legend)
        self.texts[side].value = round_html(result, r, self.decode, self.controls["prompt"].value)
        self.nodes[side].value = node_html(info)

    def _repr_mimebundle_(self, **kwargs):
        return self.box._repr_mimebundle_(**kwargs)
