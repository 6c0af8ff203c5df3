"""nbval settings for the tested notebooks.

- Smoke mode: the kernel nbval starts inherits this process's environment, so the notebooks' first
  cell sees JETFLOW_SMOKE=1 under the test runner (small prompts, steps, budgets) and does the full
  run when opened by hand. In smoke mode prompts come from the bundled fixtures unless
  JETFLOW_DATA_DIR names a folder (``jetflow.util.paths.data_dir``), so the tests need neither the offline
  data folder nor the network.
- Stored outputs, checked cells included, are refreshed by ``make notebooks-refresh``;
  tests/test_notebooks.py fails if a checked cell was committed unexecuted.
- The kernel runs in notebooks/: put the repository root on its PYTHONPATH so ``import jetflow``
  works there without an install (a relative PYTHONPATH=. would point at notebooks/).
- Plotly figures and HTML carry random ids: never compare them, even in a checked cell.
"""
import os
import sys
from pathlib import Path

os.environ.setdefault("JETFLOW_SMOKE", "1")
ROOT = str(Path(__file__).resolve().parent.parent)
sys.path.insert(0, ROOT)
from jetflow.views.notebook import QUIET  # noqa: E402

for key, value in QUIET.items():  # no tqdm bar in a kernel nbval starts (it reads these at import)
    os.environ.setdefault(key, value)
os.environ["PYTHONPATH"] = os.pathsep.join([ROOT, *filter(None, [os.environ.get("PYTHONPATH")])])

SKIP_COMPARE = ("application/vnd.plotly.v1+json", "text/html")


def pytest_collection_modifyitems(items):
    """Extend nbval's per-notebook skip list (outputs it never compares) with plotly JSON and HTML."""
    for notebook in {item.parent for item in items if hasattr(item.parent, "skip_compare")}:
        notebook.skip_compare = tuple(dict.fromkeys(notebook.skip_compare + SKIP_COMPARE))
