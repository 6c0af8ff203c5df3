"""One call at the top of every notebook: quiet libraries, smoke or full mode, threads.

    smoke = jetflow.notebook_setup()   # True when JETFLOW_SMOKE=1

Every notebook's first code cell is ``SETUP_CELL``: it installs the kit where it is missing (a checkout
skips that), calls ``notebook_setup`` and prints ``data_line()`` (where the prompts come from).

Smoke mode (``JETFLOW_SMOKE=1``, what the notebook tests set) keeps every notebook to a minute or two;
without it (or with ``JETFLOW_SMOKE=0``) a notebook runs the full-size version it describes. In smoke
mode torch uses one thread, so notebook tests can run side by side without oversubscribing the cores.
"""
from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path


QUIET = {"TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
         "TRANSFORMERS_VERBOSITY": "error"}  # what stored runs (notebooks/refresh.py, nbval) set for every kernel


def quiet_progress_bars() -> None:
    """No tqdm bar in a stored output: the GGUF loader's "Converting and de-quantizing GGUF tensors" and
    transformers' "Loading weights" bars are tqdm widgets that a static render shows frozen at 0 %.
    ``TQDM_DISABLE`` only reaches tqdm when set before its import, so a tqdm already imported is also
    switched off in place (its default ``disable``)."""
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    if os.environ.get("TQDM_DISABLE") != "1":
        return
    import sys
    from functools import partialmethod
    std = sys.modules.get("tqdm.std")  # every tqdm class (auto, notebook, asyncio) derives from this one
    if std is not None and not getattr(std.tqdm, "jetflow_quiet", False):
        std.tqdm.__init__ = partialmethod(std.tqdm.__init__, disable=True)
        std.tqdm.jetflow_quiet = True


def notebook_setup(*, threads: int | None = None) -> bool:
    """Silence progress bars and deprecation chatter, set torch threads (1 in smoke mode unless
    ``threads`` says otherwise) and return whether this is a smoke run."""
    quiet_progress_bars()
    warnings.filterwarnings("ignore")
    logging.getLogger("transformers").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()  # transformers' own weight-loading bars
    smoke = os.environ.get("JETFLOW_SMOKE", "0") == "1"
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    elif smoke:
        torch.set_num_threads(1)
    return smoke


INSTALL_GUARD = 'if importlib.util.find_spec("jetflow") is None:'
SETUP_CELL = f'''# Setup (no need to read). In a checkout this only puts the repository on the path; where the kit is
# missing (a hosted notebook: Colab, Kaggle) it installs it: set JETFLOW_REPO to the repository's pip URL
# (git+https://... or a local path). Data: $JETFLOW_DATA_DIR if set, else the bundled fixtures in
# smoke mode, else the Hugging Face hub.
import importlib.util, os, sys
from pathlib import Path

if (Path.cwd().parent / "jetflow" / "__init__.py").is_file():  # a checkout, opened in notebooks/
    sys.path.insert(0, str(Path.cwd().parent))
{INSTALL_GUARD}
    REPO = os.environ.get("JETFLOW_REPO") or sys.exit("set JETFLOW_REPO to the kit's pip URL (git+https://...)")
    %pip install -q "$REPO"
import jetflow
from jetflow.views.notebook import data_line

smoke = jetflow.notebook_setup()
print(data_line())'''


def data_line() -> str:
    """Where this run's prompts come from, in one line (the setup cell prints it)."""
    from jetflow.util.paths import data_dir, source_name
    root = data_dir()
    where = {"hub": "the Hugging Face hub (set JETFLOW_DATA_DIR to read a local copy)",
             "fixtures": "the bundled fixtures (smoke mode)"}.get(source_name(root), f"JETFLOW_DATA_DIR={root}")
    mode = "smoke" if os.environ.get("JETFLOW_SMOKE", "0") == "1" else "full"
    kit = "a checkout" if (Path(__file__).resolve().parents[2] / "pyproject.toml").is_file() else "an install"
    return f"jetflow from {kit}; {mode} mode; prompts from {where}"
