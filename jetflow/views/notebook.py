"""One call at the top of every notebook: quiet libraries, smoke or full mode, threads.

    smoke = jetflow.notebook_setup()   # True when JETFLOW_SMOKE=1

Smoke mode (``JETFLOW_SMOKE=1``, what the notebook tests set) keeps every notebook to a minute or two;
without it (or with ``JETFLOW_SMOKE=0``) a notebook runs the full-size version it describes. In smoke
mode torch uses one thread, so notebook tests can run side by side without oversubscribing the cores.
"""
from __future__ import annotations

import logging
import os
import warnings


def notebook_setup(*, threads: int | None = None) -> bool:
    """Silence progress bars and deprecation chatter, set torch threads (1 in smoke mode unless
    ``threads`` says otherwise) and return whether this is a smoke run."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
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
