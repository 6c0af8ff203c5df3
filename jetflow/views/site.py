"""A static site of the notebooks from their stored outputs, no kernel (``make site``, ``python -m jetflow site``).

    build(["notebooks/00_quickstart.ipynb", ...], "site")   # -> site/index.html, one page per notebook

Every page opens from ``file://`` with no network: plotly.js is the installed plotly package's own
``plotly.min.js``, copied beside the pages; a stored ``application/vnd.plotly.v1+json`` output becomes a live plot
(``Plotly.newPlot``), else a PNG/SVG output is shown as an image, HTML/markdown as such, text as text. Markdown
renders with mistune, code with pygments (inline styles). A relative link or image of a notebook to a file beside
it (``figures/x.png``, a player page) is copied along; a link to another notebook points at its page. The index
links every notebook page and every tree player (``jetflow.views.player``) found under ``OUT/players/``.
"""
from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path

PLOTLY_MIME = "application/vnd.plotly.v1+json"
# a markdown cell that only shows a screenshot (and its caption): dropped after the live plot it pictures
SCREENSHOT = re.compile(r"!\[[^\]]*\]\(figures/[^)]+\.png\)(\s*\*[^\n]*\*)?", re.S)
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"
PLAYERS = "players"  # the folder of OUT whose tree players the index lists
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
LINK = re.compile(r'(src|href)="([^"]*)"')
STYLE = """
body { font: 15px/1.55 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1020px;
       padding: 18px 24px 60px; color: #222; }
nav { font-size: 13.5px; margin-bottom: 14px; color: #555; }
.md img { max-width: 100%; }
.md table { border-collapse: collapse; } .md td, .md th { border: 1px solid #ddd; padding: 3px 8px; }
.md code { background: #f4f4f4; padding: 0 3px; border-radius: 3px; }
.cell { margin: 10px 0; }
.src { background: #f7f7f9; border-left: 3px solid #9ab; padding: 6px 10px; overflow-x: auto; font-size: 13px; }
.src pre, pre.out { margin: 0; white-space: pre-wrap; font-size: 12.5px; }
.out { padding: 4px 10px; } pre.out { color: #333; } pre.err { color: #a00; }
.note { color: #777; font-style: italic; font-size: 13px; }
.plot { width: 100%; min-height: 300px; }
"""
PLOT_SCRIPT = """<script>
(function () {
  if (typeof Plotly === "undefined") return;  // the stored PNGs (markdown) still show the figures
  document.querySelectorAll("div.plot").forEach(function (div) {
    var fig = JSON.parse(document.getElementById(div.id + "-json").textContent);
    div.textContent = "";
    Plotly.newPlot(div, fig.data || [], fig.layout || {}, Object.assign({responsive: true}, fig.config || {}));
  });
})();
</script>"""


def _text(value) -> str:
    """A notebook string field (a string or a list of lines) as one string."""
    return "".join(value) if isinstance(value, list) else str(value)


def _terminal(text: str) -> str:
    """Terminal output as a browser should show it: ANSI colours dropped, a carriage-return-rewritten line kept at
    its last state (a progress bar shows where it ended)."""
    lines = ANSI.sub("", text).split("\n")
    return "\n".join(line.rstrip("\r").split("\r")[-1] for line in lines)


def _markdown(text: str) -> str:
    import mistune
    return mistune.html(text)


def _code(source: str) -> str:
    from pygments import highlight
    from pygments.formatters import HtmlFormatter
    from pygments.lexers import PythonLexer
    return highlight(source, PythonLexer(), HtmlFormatter(noclasses=True, nobackground=True))


def _json_script(value, element_id: str) -> str:
    body = json.dumps(value, ensure_ascii=False).replace("<", "\\u003c")
    return f'<script type="application/json" id="{element_id}">{body}</script>'


class Page:
    """One notebook's HTML, built cell by cell; ``plots`` counts the live plotly figures."""

    def __init__(self, stem: str):
        self.stem, self.parts, self.plots, self.after_plot = stem, [], 0, False

    def output(self, out: dict) -> str:
        """One stored output as HTML (the richest form this page can show offline)."""
        kind = out.get("output_type")
        if kind == "stream":
            cls = "out err" if out.get("name") == "stderr" else "out"
            return f'<pre class="{cls}">{html.escape(_terminal(_text(out.get("text", ""))))}</pre>'
        if kind == "error":
            trace = _terminal("\n".join(out.get("traceback", [])) or f"{out.get('ename')}: {out.get('evalue')}")
            return f'<pre class="out err">{html.escape(trace)}</pre>'
        return self.rich(out.get("data", {}))

    def rich(self, data: dict) -> str:
        if PLOTLY_MIME in data:
            self.plots += 1
            pid = f"{self.stem}-plot-{self.plots}"
            return (f'<div class="plot" id="{pid}"><span class="note">an interactive figure: it needs '
                    f'plotly.min.js beside this page</span></div>{_json_script(data[PLOTLY_MIME], pid + "-json")}')
        if "image/png" in data:
            return f'<img alt="figure" src="data:image/png;base64,{_text(data["image/png"]).strip()}">'
        if "image/svg+xml" in data:
            return _text(data["image/svg+xml"])
        if "text/html" in data:
            return _text(data["text/html"])
        if "text/markdown" in data:
            return f'<div class="md">{_markdown(_text(data["text/markdown"]))}</div>'
        if WIDGET_MIME in data:
            return '<p class="note">an interactive widget: run the notebook to use it</p>'
        if "text/plain" in data:
            return f'<pre class="out">{html.escape(_terminal(_text(data["text/plain"])))}</pre>'
        return ""

    def cell(self, cell: dict) -> None:
        source = _text(cell.get("source", ""))
        after_plot, self.after_plot = self.after_plot, False
        if cell.get("cell_type") == "markdown":
            if after_plot and SCREENSHOT.fullmatch(source.strip()):
                return  # the PNG of the live plot just above (for GitHub): shown once
            self.parts.append(f'<div class="cell md">{_markdown(source)}</div>')
        elif cell.get("cell_type") == "code":
            plots = self.plots
            outs = "".join(self.output(o) for o in cell.get("outputs", []))
            self.after_plot = self.plots > plots
            self.parts.append(f'<div class="cell"><div class="src">{_code(source)}</div>'
                              f'{f"<div class=out>{outs}</div>" if outs else ""}</div>')


def title_of(nb: dict, default: str) -> str:
    """The notebook's first markdown heading (without the #s), else ``default``."""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "markdown":
            for line in _text(cell.get("source", "")).splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return default


def page_html(title: str, body: str, plotly: bool) -> str:
    """A whole page: the style, the body, and (``plotly``) the local plotly.min.js and the plotting script."""
    scripts = f'<script src="plotly.min.js"></script>\n{PLOT_SCRIPT}' if plotly else ""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
            f'<style>{STYLE}</style></head>\n<body>\n<nav><a href="index.html">jetflow notebooks</a></nav>\n'
            f'{body}\n{scripts}\n</body></html>\n')


def notebook_page(path: str | os.PathLike) -> tuple[str, str, int]:
    """(title, page HTML, live plots) of the notebook at ``path``, from its stored outputs."""
    path = Path(path)
    nb = json.loads(path.read_text(encoding="utf-8"))
    page = Page(path.stem)
    for cell in nb.get("cells", []):
        page.cell(cell)
    title = title_of(nb, path.stem)
    return title, page_html(title, "\n".join(page.parts), plotly=page.plots > 0), page.plots


def relink(page: str, source_dir: Path, out: Path) -> str:
    """Point links to ``X.ipynb`` at ``X.html`` and copy every other relative link or image that names a file inside
    ``source_dir`` (the notebooks' folder) to the same place under ``out``."""
    def fix(match: re.Match) -> str:
        attr, url = match.group(1), html.unescape(match.group(2))
        if re.match(r"^[a-z][a-z0-9+.-]*:|^#|^/", url, re.I):
            return match.group(0)
        file, _, anchor = url.partition("#")
        if file.endswith(".ipynb"):
            return f'{attr}="{html.escape(file[:-6] + ".html" + ("#" + anchor if anchor else ""))}"'
        src = (source_dir / file).resolve()
        if src.is_file() and src.is_relative_to(source_dir.resolve()):
            dest = out / src.relative_to(source_dir.resolve())
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest)
        return match.group(0)
    return LINK.sub(fix, page)


def players(out: Path) -> list[tuple[str, str]]:
    """[(link relative to ``out``, a title)] of the tree players under ``out/players``."""
    from .player import read_trace
    found = []
    for path in sorted((out / PLAYERS).glob("*.html")):
        trace = read_trace(path)
        found.append((f"{PLAYERS}/{path.name}", f"{trace['method']}, budget {trace['budget']}: "
                                                 f"{trace['prompt']!r} ({len(trace['rounds'])} rounds)"))
    return found


def index_html(pages: list[tuple[str, str]], found: list[tuple[str, str]]) -> str:
    """The index: one link per notebook page, then one per tree player."""
    items = "".join(f'<li><a href="{html.escape(href)}">{html.escape(title)}</a> <span class="note">'
                    f'{html.escape(href.removesuffix(".html"))}.ipynb</span></li>' for href, title in pages)
    body = (f"<h1>jetflow notebooks</h1><p>Rendered from the notebooks' stored outputs (no kernel ran to "
            f"build this site: <code>make site</code>); the plotly figures are live, from a local plotly.js.</p>"
            f"<h2>Notebooks</h2><ul>{items}</ul>")
    if found:
        body += ("<h2>Tree players</h2><p>One decode, round by round: the drafted tree, the accepted path, what "
                 "the target rejected and wrote instead (<code>python -m jetflow trace</code>).</p><ul>"
                 + "".join(f'<li><a href="{html.escape(h)}">{html.escape(t)}</a></li>' for h, t in found) + "</ul>")
    return page_html("jetflow notebooks", body, plotly=False)


def plotly_js() -> Path:
    """The installed plotly package's plotly.min.js (FileNotFoundError if this plotly lacks it)."""
    import plotly
    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the installed plotly has no plotly.min.js; pip install 'plotly>=5.20'")
    return path


def build(notebooks, out: str | os.PathLike) -> list[Path]:
    """Write ``out/index.html``, one page per notebook (``notebooks``: paths of .ipynb files), ``plotly.min.js``
    and the files the notebooks link to; return the pages written, the index first."""
    notebooks, out = [Path(n) for n in notebooks], Path(out)
    if not notebooks:
        raise ValueError("build needs at least one notebook")
    missing = [str(n) for n in notebooks if not n.is_file()]
    if missing:
        raise FileNotFoundError(f"no notebook at {', '.join(missing)}")
    out.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(plotly_js(), out / "plotly.min.js")
    written, pages = [], []
    for nb in notebooks:
        title, page, _ = notebook_page(nb)
        dest = out / f"{nb.stem}.html"
        dest.write_text(relink(page, nb.parent, out), encoding="utf-8")
        written.append(dest)
        pages.append((dest.name, title))
    index = out / "index.html"
    index.write_text(index_html(pages, players(out)), encoding="utf-8")
    return [index] + written
