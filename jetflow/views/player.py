"""The tree player: one self-contained HTML page that steps through a decode's rounds (``python -m jetflow trace``).

    from jetflow.views.player import write_player
    from jetflow.views.trace import record
    write_player(record(res, target.decode, method="jetflow-pc", budget=16, prompt=prompt), "tree.html")

The page (template: ``player.html`` beside this module, plain HTML/CSS/JS/SVG, no library, no network) reads the
trace from ``<script type="application/json" id="jetflow-trace">``; it shows each round's drafted tree (token
texts quoted, whitespace as glyphs), the accepted path, the rejected children with the target's token, the
bonus token, the answer so far and the acceptance by depth and sibling rank over all rounds. ``#prev`` /
``#next``, ArrowLeft / ArrowRight and ``input#round-slider`` step through the rounds; ``#round-label`` reads
``I / N``. It opens from ``file://``.
"""
from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path

from .trace import check

TEMPLATE = "player.html"


def trace_json(trace: dict) -> str:
    """``trace`` as JSON safe inside a ``<script>`` element: every ``<`` escaped as ``\\u003c`` (so no
    ``</script>`` or ``<!--`` in a token can end the element), non-ASCII kept."""
    return json.dumps(trace, ensure_ascii=False).replace("<", "\\u003c")


def player_html(trace: dict) -> str:
    """The player page for ``trace`` (``jetflow.views.trace.record``'s dict) as one HTML string."""
    page = (resources.files("jetflow.views") / TEMPLATE).read_text(encoding="utf-8")
    title = html.escape(f"jetflow tree player: {check(trace)['method']}, budget {trace['budget']}")
    return page.replace("__TITLE__", title).replace("__TRACE__", trace_json(trace))


def write_player(trace: dict, path: str | os.PathLike) -> Path:
    """Write the player page of ``trace`` to ``path`` (its folder is created) and return the path. One line in a
    notebook: ``write_player(record(res, target.decode, method=m, budget=b, prompt=p), "tree.html")``."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(player_html(trace), encoding="utf-8")
    return out


def read_trace(path: str | os.PathLike) -> dict:
    """The trace embedded in a player page written by ``write_player`` (ValueError if the page has none)."""
    page = Path(path).read_text(encoding="utf-8")
    start_tag = '<script type="application/json" id="jetflow-trace">'
    start = page.find(start_tag)
    if start < 0:
        raise ValueError(f"{path} holds no jetflow-trace script (write it with jetflow.views.player.write_player)")
    start += len(start_tag)
    return json.loads(page[start:page.index("</script>", start)])
