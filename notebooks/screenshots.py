"""Screenshots of notebook outputs as a person sees them: JupyterLab in headless Chromium.

    python notebooks/screenshots.py [--out notebooks/figures] [--only PNG ...] [00_quickstart.ipynb ... 05_budget_scaling.ipynb]

Starts JupyterLab (smoke mode, a fixed token, a throwaway settings/workspace folder with autosave off,
so the notebooks on disk are never rewritten), runs every cell through the Run menu, waits for the
kernel and the figures, and saves a PNG of every key figure (``TARGETS``; the notebooks show them in a
markdown cell after the figure, for readers without a kernel). For 03 it then tests the explorer as a
person uses it: it reruns the explorer's cell, shoots it, picks another method in a dropdown and clicks
a node, checks that the figure title and the node panel changed, and shoots it again. $JETFLOW_DATA_DIR and
$JETFLOW_HEADS_DIR pass through from the environment. Needs `pip install playwright` and a Chromium
($CHROMIUM, default /usr/bin/chromium); run it with the Python whose JupyterLab holds the plotly, anywidget
and widgets extensions (from another environment, point $JUPYTER_PATH at that one's share/jupyter, or no
figure renders). A dev tool, not part of the library.
"""
import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from playwright.sync_api import sync_playwright

HERE = Path(__file__).resolve().parent
TOKEN = "jetflow-screenshots"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# notebook stem -> [(png, the code cell whose output is shot (last match with a figure), plotly figures in it)]
TARGETS = {
    "00_quickstart": [("00_round.png", re.compile(r"viz\.render_round\(res, best"), 1),
                      ("00_tokens_per_round.png", re.compile(r"viz_rounds\.tokens_per_round\(res\)"), 1)],
    "01_how_jetflow_drafts": [
        ("01_toy_table.png", re.compile(r"viz\.logp_table\(toy"), 1),
        ("01_toy_best_prefix.png", re.compile(r'viz\.tree_figure\(toy_trees\["best_prefix"\]'), 1),
        ("01_toy_accum_logp.png", re.compile(r'viz\.tree_figure\(toy_trees\["accum_logp'), 1),
        ("01_block_masks.png", re.compile(r"viz\.masks_figure\(block_size=8, n_ctx=4\)"), 1),
        ("01_real_table.png", re.compile(r"viz\.logp_table\(logp"), 1),
        ("01_tree.png", re.compile(r"viz\.tree_figure\(trees\[16\]"), 1),
        ("01_verify_mask.png", re.compile(r"viz\.tree_mask\("), 1),
        ("01_acceptance_table.png", re.compile(r"viz_rounds\.acceptance_table\("), 1),
        ("01_round.png", re.compile(r"viz\.tree_figure\(rnd"), 1),
        ("01_correction.png", re.compile(r"viz_trees\.correction_figure\(diag"), 1),
        ("01_pc_round.png", re.compile(r"viz\.tree_figure\(pc_rnd"), 1),
        ("01_cost.png", re.compile(r"viz_rows\.verify_cost\("), 1),
        ("01_sampling.png", re.compile(r"viz_rounds\.distribution_check\("), 1)],
    "02_train_a_draft_head": [("02_shipped_curves.png", re.compile(r"viz_train\.heads_curves\(shipped"), 1),
                              ("02_tau_curve.png", re.compile(r"curve\.plot\(curve_rows"), 1)],
    "03_tree_explorer": [("03_acceptance_heatmap.png", re.compile(r"viz_rounds\.acceptance_heatmap\("), 1)],
    "05_budget_scaling": [("05_live_tau.png", re.compile(r'viz_rows\.budget_curve\(tree_rows, "tau"\)'), 1),
                          ("05_replayed_tau.png", re.compile(r'in METHODS\], "tau"\)'), 1),
                          ("05_decoded_speedup.png", re.compile(r'viz_rows\.budget_curve\(grid, "speedup"\)'), 1),
                          ("05_correction_tau.png", re.compile(r'"jetflow-bp", "jetflow-pc"\)\], "tau"\)'), 1)],
}
EXPLORER_CELL = re.compile(r"explorer = TreeExplorer\(")  # 03: the cell whose widget is driven by hand
SETTINGS = {  # JupyterLab user settings: never save, no toasts, every cell in the DOM
    "docmanager-extension/plugin": {"autosave": False},
    "apputils-extension/notification": {"checkForUpdates": False, "doNotDisturbMode": True, "fetchNews": "false"},
    "notebook-extension/tracker": {"windowingMode": "none"},
}


def start_lab(tmp: Path) -> tuple[subprocess.Popen, str]:
    for name, value in SETTINGS.items():
        path = tmp / "settings" / "@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "JETFLOW_SMOKE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent), os.environ.get("PYTHONPATH")]))}
    lab = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--IdentityProvider.token={TOKEN}",
         "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", f"--ServerApp.root_dir={HERE}",
         f"--LabApp.user_settings_dir={tmp / 'settings'}",
         f"--LabApp.workspaces_dir={tmp / 'workspaces'}", f"--FileCheckpoints.checkpoint_dir={tmp / 'checkpoints'}"],
        env=env, stdout=open(tmp / "lab.log", "w"), stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    for _ in range(240):
        if lab.poll() is not None:
            raise RuntimeError(f"JupyterLab exited early:\n{(tmp / 'lab.log').read_text()[-3000:]}")
        try:
            urllib.request.urlopen(f"{base}/api/status?token={TOKEN}", timeout=5)
            return lab, base
        except OSError:
            time.sleep(1)
    lab.terminate()
    raise RuntimeError("JupyterLab did not answer within 4 minutes")


def shoot(page, base: str, notebook: str, out: Path, timeout_s: float, only: set[str] | None = None) -> list[Path]:
    page.goto(f"{base}/lab/tree/{Path(notebook).name}?reset&token={TOKEN}")  # reset: only this notebook open
    nb = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
    # the status bar's "Python 3 (ipykernel) | Idle" (the toolbar says idle already while there is no kernel)
    kernel_idle = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"^(?!No Kernel).+ \| Idle$"))
    kernel_idle.wait_for(timeout=180_000)
    if page.locator("#jp-left-stack").is_visible():  # collapse the file browser: a wider notebook
        page.keyboard.press("Control+b")
    page.locator(".lm-MenuBar-itemLabel", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-itemLabel", has_text=re.compile(r"^Run All Cells$")).click()
    prompts, deadline = nb.locator(".jp-CodeCell .jp-InputPrompt"), time.time() + timeout_s
    while True:  # until the kernel is idle and no cell is queued or running ("[*]:")
        page.wait_for_timeout(2000)
        texts = prompts.all_inner_texts()
        if kernel_idle.count() and not any("*" in t for t in texts):
            break
        if time.time() > deadline:
            raise TimeoutError(f"{notebook}: still running after {timeout_s:.0f}s: {texts}")
    not_run = [i for i, t in enumerate(texts) if not re.search(r"\d", t)]
    if not_run and not_run[0] == 0:
        raise RuntimeError(f"{notebook}: no cell ran (did the kernel die?)")
    if not_run:  # Run All stops at the first error: show that cell's output
        failed = nb.locator(".jp-CodeCell").nth(not_run[0] - 1).locator(".jp-OutputArea").inner_text()
        raise RuntimeError(f"{notebook}: code cell {not_run[0] - 1} failed, later cells did not run:\n{failed[-4000:]}")
    shots = [shot(page, nb, out / png, cell_text, n_plots) for png, cell_text, n_plots in TARGETS[Path(notebook).stem]
             if not only or png in only]
    if Path(notebook).stem == "03_tree_explorer" and (not only or only & {"03_explorer_before.png", "03_explorer_after.png"}):
        shots += drive_explorer(page, nb, out, kernel_idle)
    return shots


def drive_explorer(page, nb, out: Path, kernel_idle) -> list[Path]:
    """Rerun the explorer's cell (a fresh widget, as it opens), shoot it, pick "dflash" on the right, click
    a node on the left, check that both changed what is shown, and shoot it again."""
    cell = nb.locator(".jp-CodeCell").filter(has_text=EXPLORER_CELL).first
    cell.scroll_into_view_if_needed()
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Control+Enter")
    page.wait_for_timeout(2000)
    kernel_idle.wait_for(timeout=180_000)
    plots = cell.locator(".js-plotly-plot")
    plots.nth(1).locator(".gtitle").wait_for(timeout=120_000)
    titles = lambda: [plots.nth(k).locator(".gtitle").text_content() for k in (0, 1)]  # noqa: E731  (SVG text)
    panels = cell.locator(".widget-html-content")
    before_title, before_panels = titles(), panels.all_inner_texts()
    if "click a node" not in " ".join(before_panels):
        raise RuntimeError(f"the explorer did not open with an empty node panel: {before_panels}")
    paths = [shot_locator(page, cell.locator(".jp-Cell-outputArea").first, out / "03_explorer_before.png")]
    cell.locator(".widget-dropdown", has_text="right").locator("select").select_option("dflash")
    wait_until(page, lambda: titles()[1] != before_title[1] and "dflash" in titles()[1], "the right figure to redraft")
    node = plots.nth(0).locator(".scatterlayer .trace").nth(3).locator(".points path").last  # deepest accepted node
    box = node.bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    page.mouse.down()
    page.mouse.up()
    wait_until(page, lambda: "top choices" in " ".join(panels.all_inner_texts()), "the node panel to fill")
    if titles()[0] != before_title[0]:
        raise RuntimeError(f"the left figure changed without a change on the left: {titles()[0]!r}")
    paths.append(shot_locator(page, cell.locator(".jp-Cell-outputArea").first, out / "03_explorer_after.png"))
    print(f"explorer: right title {before_title[1]!r} -> {titles()[1]!r}; node panel filled on a click")
    return paths


def wait_until(page, condition, what: str, timeout_s: float = 120) -> None:
    deadline = time.time() + timeout_s
    while not condition():
        if time.time() > deadline:
            raise TimeoutError(f"waited {timeout_s:.0f}s for {what}")
        page.wait_for_timeout(500)


NO_MODEBAR = ".modebar-container { display: none !important; }"  # plotly's toolbar: not part of a figure


def shot_locator(page, output, path: Path) -> Path:
    page.add_style_tag(content=NO_MODEBAR)
    page.mouse.move(0, 0)  # no hover label either
    height = output.bounding_box()["height"]  # the notebook scrolls inside a fixed layout: fit the viewport to it
    page.set_viewport_size({"width": page.viewport_size["width"], "height": max(800, int(height) + 250)})
    output.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # plotly redraws after the resize
    output.screenshot(path=path)
    return path


def shot(page, nb, path: Path, cell_text: re.Pattern, n_plots: int) -> Path:
    """Save the output of the last code cell matching ``cell_text`` that holds a figure."""
    cell = nb.locator(".jp-CodeCell").filter(has_text=cell_text).filter(has=page.locator(".js-plotly-plot")).last
    cell.scroll_into_view_if_needed()  # cells out of view are not rendered (content-visibility) and count as hidden
    cell.locator(".js-plotly-plot .main-svg").nth(n_plots - 1).wait_for(timeout=60_000)
    # the cell's own output, not the outputs nested in a widget's Output areas
    output = cell.locator(".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output").last
    return shot_locator(page, output, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", default=[f"{stem}.ipynb" for stem in TARGETS])
    ap.add_argument("--out", type=Path, default=HERE / "figures")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per notebook to run all cells")
    ap.add_argument("--only", nargs="+", metavar="PNG", help="shoot just these pictures (e.g. 01_pc_round.png)")
    args = ap.parse_args()
    unknown = [n for n in args.notebooks if Path(n).stem not in TARGETS]
    if unknown:
        ap.error(f"no screenshot target for {unknown}; known: {list(TARGETS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a kill still runs the cleanup below
    with tempfile.TemporaryDirectory(prefix="jetflow-shots-") as tmp:
        tmp = Path(tmp)
        lab, base = start_lab(tmp)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch_persistent_context(
                    tmp / "chromium", executable_path=os.environ.get("CHROMIUM", "/usr/bin/chromium"),
                    args=CHROMIUM_ARGS, viewport={"width": 1300, "height": 800})
                for notebook in args.notebooks:
                    t0, page = time.time(), browser.new_page()
                    print(f"{notebook}: running all cells ...", flush=True)
                    try:
                        shots = shoot(page, base, notebook, args.out, args.timeout, set(args.only or ()))
                        print(", ".join(map(str, shots)), f"({time.time() - t0:.0f}s)")
                    except Exception:
                        failed = args.out / f"_failed_{Path(notebook).stem}.png"  # the whole window, to see why
                        with contextlib.suppress(Exception):
                            page.screenshot(path=failed)
                            print(f"window at failure: {failed}", file=sys.stderr)
                        log = (tmp / "lab.log").read_text().splitlines()  # the kernel's own stderr lands here
                        print("JupyterLab log, last lines:", *log[-30:], sep="\n", file=sys.stderr)
                        raise
                    finally:
                        page.close()
                browser.close()
        finally:
            lab.terminate()
            try:
                lab.wait(30)
            except subprocess.TimeoutExpired:
                lab.kill()


if __name__ == "__main__":
    main()
