"""The static site (``python -m jetflow site``): one page per committed notebook from its stored outputs, plotly
outputs as live plots over a local plotly.min.js, linked files copied, no http(s) source anywhere."""
import json
import re
from pathlib import Path

import pytest

from jetflow.cli import main
from jetflow.views import site
from jetflow.views.player import write_player

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
TRACE = {"format": "jetflow-trace/1", "method": "lookup", "budget": 4, "prompt": "p", "text": "ab", "tokens": [5, 6],
         "first": {"token": 5, "text": "a"}, "tau": 1.0, "acceptance": {"attempts": [], "accepts": []},
         "rounds": [{"index": 0, "nodes": [{"id": 0, "parent": -1, "depth": 0, "rank": 0, "token": 5, "text": "a"}],
                     "accepted": [0], "target": [{"token": 6, "text": "b"}], "rejected": [],
                     "bonus": {"token": 6, "text": "b"}, "committed": [{"token": 6, "text": "b"}]}]}


def plotly_outputs(path: Path) -> int:
    nb = json.loads(path.read_text())
    return sum(site.PLOTLY_MIME in o.get("data", {}) for c in nb["cells"] for o in c.get("outputs", []))


def test_the_site_renders_every_notebook_offline(tmp_path):
    write_player(TRACE, tmp_path / "players" / "one.html")
    assert main(["site", "--out", str(tmp_path), *map(str, NOTEBOOKS)]) == 0
    index = (tmp_path / "index.html").read_text()
    for nb in NOTEBOOKS:
        assert f'href="{nb.stem}.html"' in index
        page = (tmp_path / f"{nb.stem}.html").read_text()
        assert not re.search(r"""src\s*=\s*["']?\s*(https?:)?//""", page, re.I), nb.name
        assert page.count('<div class="plot"') == plotly_outputs(nb)
        assert ('src="plotly.min.js"' in page) == (plotly_outputs(nb) > 0)
        assert ".ipynb\"" not in page  # links between notebooks point at their pages
        for src in re.findall(r'src="([^"]+)"', page):
            assert src.startswith("data:") or (tmp_path / src).is_file(), (nb.name, src)
    assert 'href="players/one.html"' in index and (tmp_path / "plotly.min.js").stat().st_size > 1_000_000
    assert sum(map(plotly_outputs, NOTEBOOKS)) > 0  # the committed notebooks keep plotly outputs to show


def test_outputs_render_as_a_browser_should_show_them():
    page = site.Page("x")
    bar = {"output_type": "stream", "name": "stderr", "text": "load:  0%|\rload: 50%|\rload: 100%|\x1b[0m done\n"}
    assert site.Page("x").output(bar) == '<pre class="out err">load: 100%| done\n</pre>'
    plot = page.output({"output_type": "display_data", "data": {site.PLOTLY_MIME: {"data": [], "layout": {}},
                                                              "text/plain": "Figure()"}})
    assert 'id="x-plot-1"' in plot and '<script type="application/json" id="x-plot-1-json">' in plot
    png = page.output({"output_type": "display_data", "data": {"image/png": "iVBOR\n", "text/plain": "<Figure>"}})
    assert png == '<img alt="figure" src="data:image/png;base64,iVBOR">'
    widget = page.output({"output_type": "display_data",
                          "data": {site.WIDGET_MIME: {}, "text/plain": "VBox(children=(...))"}})
    assert "VBox" not in widget and "widget" in widget
    err = page.output({"output_type": "error", "ename": "E", "evalue": "<b>", "traceback": ["\x1b[31mE: <b>"]})
    assert err == '<pre class="out err">E: &lt;b&gt;</pre>'


def test_a_missing_notebook_is_one_error_line(tmp_path, capsys):
    assert main(["site", "--out", str(tmp_path), str(tmp_path / "nope.ipynb")]) == 2
    assert capsys.readouterr().err.startswith("error: no notebook at")


def test_an_empty_notebook_list_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at least one notebook"):
        site.build([], tmp_path)


def test_a_screenshot_right_after_its_live_plot_is_shown_once():
    page = site.Page("x")
    plot = {"cell_type": "code", "source": "fig", "outputs": [
        {"output_type": "display_data", "data": {site.PLOTLY_MIME: {"data": [], "layout": {}}}}]}
    shot = {"cell_type": "markdown", "source": "![a round](figures/00_round.png)\n\n*The round, drawn.*"}
    page.cell(plot)
    page.cell(shot)
    page.cell(shot)  # not after a plot: kept
    assert sum("00_round.png" in p for p in page.parts) == 1 and len(page.parts) == 2
