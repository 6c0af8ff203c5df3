"""Re-execute notebooks in smoke mode, in place (``make notebooks-refresh``).

    python notebooks/refresh.py notebooks/*.ipynb

Every cell runs top to bottom in a fresh kernel with ``JETFLOW_SMOKE=1`` (what ``pytest --nbval-lax``
compares against), so the stored outputs, checked cells (``# NBVAL_CHECK_OUTPUT``) included, all come from
one run of the current code. Stored runs are quiet (``jetflow.views.notebook.QUIET``: no tqdm bar, which a
static render would show frozen at 0 %). Plotly figures are stored as their JSON (1-5 kB each with the
kit's template; ``make site`` turns them into live plots; the PNGs beside the notebooks show them on
GitHub); widget views are dropped (without a kernel they render as their text repr), and so are the cells'
execution timestamps. tests/test_notebook_outputs.py checks the result on every committed notebook.
A notebook that raises is left unchanged and the command fails, naming it. With ``--checked-only`` the
whole notebook still runs, but only the checked cells' outputs are written back: the rest keep the outputs
of the full-mode run that produced them (paths of a temporary folder, timings), so a change to committed
rows refreshes just the numbers ``make test`` compares. With ``--setup-cell`` the first code cell becomes
``jetflow.views.notebook.SETUP_CELL`` first (it must call ``notebook_setup()`` already).
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from jetflow.views.notebook import QUIET, SETUP_CELL  # noqa: E402  (the repository's, not an installed copy)
WIDGET = "application/vnd.jupyter.widget-view+json"  # a live widget: nothing to see without a kernel
PLOTLY = "application/vnd.plotly.v1+json"


SMOKE_FOLDER = re.compile(r"[^\s'\"]*jetflow-smoke-[A-Za-z0-9_]+")  # 02's temporary work folder (tempfile.mkdtemp)


def clean(nb) -> None:
    """Drop widget views (with their text repr), the HTML twin of a stored plotly figure, and the
    cells' execution timestamps; then the outputs left with nothing to show. A smoke run's temporary
    folder becomes ``<smoke work folder>``: a path of this machine means nothing to a reader."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            if "text" in out:
                out["text"] = SMOKE_FOLDER.sub("<smoke work folder>", out["text"])
            data = out.get("data", {})
            if WIDGET in data:
                data.clear()
            if PLOTLY in data:
                data.pop("text/html", None)
        cell.outputs = [o for o in cell.outputs if "data" not in o or o["data"]]
    nb.metadata.pop("widgets", None)


CHECKED = "# NBVAL_CHECK_OUTPUT"


def set_setup_cell(path: Path) -> None:
    """Make the first code cell ``SETUP_CELL`` (install the kit where missing, notebook_setup, the data line)."""
    nb = nbformat.read(path, as_version=4)
    first = next(c for c in nb.cells if c.cell_type == "code")
    if "notebook_setup()" not in first.source:
        raise ValueError(f"{path}: the first code cell does not call notebook_setup(); edit it by hand")
    first.source = SETUP_CELL
    nbformat.write(nb, path)


def refresh(path: Path, timeout: int, checked_only: bool = False) -> None:
    nb = nbformat.read(path, as_version=4)
    ran = nbformat.read(path, as_version=4)
    NotebookClient(ran, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    clean(ran)
    if checked_only:  # the stored notebook, with the checked cells' new outputs
        for cell, new in zip(nb.cells, ran.cells):
            if cell.cell_type == "code" and cell.source.startswith(CHECKED):
                cell.outputs, cell.execution_count = new.outputs, new.execution_count
        ran = nb
    nbformat.write(ran, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("notebooks", nargs="+", type=Path)
    p.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    p.add_argument("--checked-only", action="store_true",
                   help="write back only the outputs of the # NBVAL_CHECK_OUTPUT cells")
    p.add_argument("--setup-cell", action="store_true",
                   help="first make each notebook's first code cell jetflow.views.notebook.SETUP_CELL")
    args = p.parse_args(argv)
    os.environ.update(JETFLOW_SMOKE="1", PLOTLY_RENDERER="plotly_mimetype", **QUIET)  # the kernels inherit these
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    failed = []
    for path in args.notebooks:
        print(f"refreshing {path}", file=sys.stderr, flush=True)
        try:
            if args.setup_cell:
                set_setup_cell(path)
            refresh(path, args.timeout, args.checked_only)
        except CellExecutionError as err:
            print(f"{path}: {str(err).splitlines()[0] if str(err) else 'a cell failed'}", file=sys.stderr)
            failed.append(str(path))
    if failed:
        print(f"not refreshed (a cell raised): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
