"""The pages in a real browser (headless Chromium). The tree explorer (JupyterLab, as `make screenshots` runs
it): picking another method in a dropdown redrafts that side and clicking a node fills the node panel;
``notebooks/screenshots.py`` raises when either does not change what is shown (~3 minutes on 2 CPU cores). The
tree player and the site (``python -m jetflow trace`` / ``site``) open from file:// with every network request
blocked, none attempted and no page error; the player's round label steps with a click and a key, the site's
stored plotly figures are live plots. Needs playwright and a Chromium ($CHROMIUM, default /usr/bin/chromium);
skipped without them."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fakes import GlyphTokenizer, tiny_model

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@pytest.mark.slow
def test_explorer_reacts_to_a_dropdown_and_a_click(tmp_path):
    pytest.importorskip("playwright")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    run = subprocess.run([sys.executable, str(ROOT / "notebooks" / "screenshots.py"), "--out", str(tmp_path),
                          "03_tree_explorer.ipynb"], capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "node panel filled on a click" in run.stdout
    before, after = (tmp_path / f"03_explorer_{s}.png" for s in ("before", "after"))
    assert before.read_bytes()[:8] == after.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert before.read_bytes() != after.read_bytes()


def browser():
    """A playwright context manager and the Chromium path, or a skip naming what is missing."""
    playwright = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    return playwright.sync_playwright()


def open_offline(pw, url: str):
    """(page, problems): ``url`` opened with every non-file request aborted; ``problems`` collects each such
    request, page error and console error."""
    chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
    page = chromium.new_page(viewport={"width": 1300, "height": 900})
    problems = []
    page.on("pageerror", lambda err: problems.append(f"page error: {err}"))
    page.on("console", lambda msg: problems.append(f"console: {msg.text}") if msg.type == "error" else None)

    def route(r):
        if r.request.url.startswith("file:"):
            return r.continue_()
        problems.append(f"network: {r.request.url}")
        return r.abort()
    page.route("**/*", route)
    page.goto(url)
    return page, problems


def test_the_player_steps_with_a_click_and_a_key_offline(tmp_path):
    from jetflow.drafting.methods import make_proposer
    from jetflow.engine.decode import generate
    from jetflow.engine.target import Target
    from jetflow.views.player import write_player
    from jetflow.views.trace import record
    with browser() as pw:
        target = Target(tiny_model("llama", 64, seed=3, eos=2), GlyphTokenizer(64), "tiny-glyph")
        res = generate(target, "abc abc abc abc", make_proposer("lookup", target), budget=8, max_new_tokens=40)
        path = write_player(record(res, target.decode, method="lookup", budget=8, prompt="abc"), tmp_path / "p.html")
        page, problems = open_offline(pw, path.as_uri())
        n = len(res.rounds)
        label = lambda: page.inner_text("#round-label")  # noqa: E731
        assert label() == f"1 / {n}" and n > 3
        page.click("#next")
        assert label() == f"2 / {n}"
        page.keyboard.press("ArrowRight")
        assert label() == f"3 / {n}"
        page.keyboard.press("ArrowLeft")
        page.click("#prev")
        assert label() == f"1 / {n}"
        page.fill("#round-slider", str(n))
        assert label() == f"{n} / {n}" and page.eval_on_selector("#round-slider", "e => e.value") == str(n)
        labels = page.locator("svg#tree g.node > text:first-of-type").all_text_contents()
        assert len(labels) == len(res.rounds[-1].tree)  # every node labelled, whitespace glyphed in quotes
        assert all(("\u201c" in t and " " not in t.strip("\u2717 ")) or t == "\u2205" for t in labels), labels
        assert page.locator("svg#tree rect[fill='#ffd92f']").count() == len(res.rounds[-1].path)  # the path
        assert problems == []


def test_a_site_page_shows_live_plotly_plots_offline(tmp_path):
    from jetflow.views import site
    with browser() as pw:
        notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
        site.build(notebooks, tmp_path)
        counts = {nb.stem: (tmp_path / f"{nb.stem}.html").read_text().count('<div class="plot"') for nb in notebooks}
        stem = max(counts, key=counts.get)
        assert counts[stem] > 0, "no committed notebook stores a plotly output"
        page, problems = open_offline(pw, (tmp_path / f"{stem}.html").as_uri())
        page.wait_for_selector(".js-plotly-plot")
        assert page.locator(".js-plotly-plot").count() == counts[stem]
        index, more = open_offline(pw, (tmp_path / "index.html").as_uri())
        assert index.locator("a").count() > len(notebooks)
        assert problems == [] and more == []


def test_the_offline_check_catches_a_network_request(tmp_path):
    """The two tests above can fail: a page that fetches from the network is caught, and not fetched."""
    with browser() as pw:
        page_file = tmp_path / "net.html"
        page_file.write_text('<img src="https://example.com/x.png"><script>nope()</script>')
        _, problems = open_offline(pw, page_file.as_uri())
        assert any(p.startswith("network: https://example.com/") for p in problems)
        assert any(p.startswith("page error:") for p in problems)
