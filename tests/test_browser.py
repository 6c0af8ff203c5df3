"""The tree explorer in a real browser (JupyterLab + headless Chromium, as `make screenshots` runs it):
picking another method in a dropdown redrafts that side and clicking a node fills the node panel.
``notebooks/screenshots.py`` raises when either does not change what is shown. Needs playwright and a
Chromium ($CHROMIUM, default /usr/bin/chromium); skipped without them. ~3 minutes on 2 CPU cores."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
