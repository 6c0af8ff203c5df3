"""Screenshots of notebook outputs as a person sees them: JupyterLab in headless Chromium.

    python notebooks/screenshots.py [--out data/results] [03_tree_explorer.ipynb 05_budget_scaling.ipynb]

Starts JupyterLab (smoke mode, a fixed token, a throwaway settings/workspace folder with autosave off,
so the notebooks on disk are never rewritten), runs every cell through the Run menu, waits for the
kernel and the figures, and saves a PNG of the output of interest. $JETFLOW_DATA_DIR and
$JETFLOW_HEADS_DIR pass through from the environment. Needs `pip install playwright` and a Chromium
($CHROMIUM, default /usr/bin/chromium). A dev tool, not part of the library.
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
    "03_tree_explorer": [("tree_explorer.png", re.compile(r"viz\.TreeExplorer\("), 2)],
    "05_budget_scaling": [("budget_scaling.png", re.compile(r'budget_curve\(headline, "tau"\)'), 1),
                          ("budget_speedup.png", re.compile(r'budget_curve\(grid, "speedup"\)'), 1)],
}
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


def shoot(page, base: str, notebook: str, out: Path, timeout_s: float) -> list[Path]:
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
    return [shot(page, nb, out / png, cell_text, n_plots) for png, cell_text, n_plots in TARGETS[Path(notebook).stem]]


def shot(page, nb, path: Path, cell_text: re.Pattern, n_plots: int) -> Path:
    """Save the output of the last code cell matching ``cell_text`` that holds a figure."""
    cell = nb.locator(".jp-CodeCell").filter(has_text=cell_text).filter(has=page.locator(".js-plotly-plot")).last
    cell.locator(".js-plotly-plot .main-svg").nth(n_plots - 1).wait_for(timeout=60_000)
    # the cell's own output, not the outputs nested in a widget's Output areas
    output = cell.locator(".jp-Cell-outputArea > .jp-OutputArea-child > .jp-OutputArea-output").last
    height = output.bounding_box()["height"]  # the notebook scrolls inside a fixed layout: fit the viewport to it
    page.set_viewport_size({"width": page.viewport_size["width"], "height": max(800, int(height) + 250)})
    output.scroll_into_view_if_needed()
    page.wait_for_timeout(1500)  # plotly redraws after the resize
    output.screenshot(path=path)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", default=[f"{stem}.ipynb" for stem in TARGETS])
    ap.add_argument("--out", type=Path, default=HERE.parent / "data" / "results")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per notebook to run all cells")
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
                    args=CHROMIUM_ARGS, viewport={"width": 1200, "height": 800})
                for notebook in args.notebooks:
                    t0, page = time.time(), browser.new_page()
                    print(f"{notebook}: running all cells ...", flush=True)
                    try:
                        shots = shoot(page, base, notebook, args.out, args.timeout)
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
