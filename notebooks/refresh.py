"""Re-execute notebooks in smoke mode, in place (``make notebooks-refresh``).

    python notebooks/refresh.py notebooks/*.ipynb

Every cell runs top to bottom in a fresh kernel with ``JETFLOW_SMOKE=1`` (what ``pytest --nbval-lax``
compares against), so the stored outputs, checked cells (``# NBVAL_CHECK_OUTPUT``) included, all come from
one run of the current code. Plotly figures are not stored (their JSON carries random ids and weighs
hundreds of kilobytes; the PNGs beside the notebooks show them on GitHub): their outputs are dropped.
A notebook that raises is left unchanged and the command fails, naming it. With ``--checked-only`` the
whole notebook still runs, but only the checked cells' outputs are written back: the rest keep the outputs
of the full-mode run that produced them (paths of a temporary folder, timings), so a change to committed
rows refreshes just the numbers ``make test`` compares.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

ROOT = Path(__file__).resolve().parent.parent
DROPPED = ("application/vnd.plotly.v1+json", "text/html")  # figures; text and widget views stay


def strip_figures(nb) -> None:
    """Remove figure payloads from every output, then the outputs left with nothing to show."""
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for out in cell.outputs:
            for mime in DROPPED:
                out.get("data", {}).pop(mime, None)
            if "data" in out and set(out["data"]) == {"text/plain"} and out["data"]["text/plain"].startswith("Figure("):
                out["data"].clear()
        cell.outputs = [o for o in cell.outputs if "data" not in o or o["data"]]
    nb.metadata.pop("widgets", None)


CHECKED = "# NBVAL_CHECK_OUTPUT"


def refresh(path: Path, timeout: int, checked_only: bool = False) -> None:
    nb = nbformat.read(path, as_version=4)
    ran = nbformat.read(path, as_version=4)
    NotebookClient(ran, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    strip_figures(ran)
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
    args = p.parse_args(argv)
    os.environ.update(JETFLOW_SMOKE="1", PLOTLY_RENDERER="plotly_mimetype")  # the kernels inherit these
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    failed = []
    for path in args.notebooks:
        print(f"refreshing {path}", file=sys.stderr, flush=True)
        try:
            refresh(path, args.timeout, args.checked_only)
        except CellExecutionError as err:
            print(f"{path}: {str(err).splitlines()[0] if str(err) else 'a cell failed'}", file=sys.stderr)
            failed.append(str(path))
    if failed:
        print(f"not refreshed (a cell raised): {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
