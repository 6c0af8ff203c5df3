"""This machine's memory bandwidth from a plain copy: the ceiling every decode's weight reads run under.

``copy_bandwidth`` copies a buffer far larger than the caches (``torch.Tensor.copy_``, ``threads``
torch threads) and counts the bytes read plus the bytes written; the best of a few repeats is the
figure (a shared machine only ever slows a copy down). A decode step reads every weight once, so
``bandwidth / weight bytes`` bounds AR tokens/s from above (docs/speed.md).
"""
from __future__ import annotations

import time

import torch


def copy_bandwidth(mib: int = 512, repeats: int = 5, threads: int | None = None) -> dict:
    """{"mib", "threads", "seconds", "gb_per_s"} of the fastest of ``repeats`` copies of ``mib`` MiB."""
    if mib < 1 or repeats < 1:
        raise ValueError("mib and repeats must be >= 1")
    before = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        src = torch.ones(mib * 2**20 // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)  # touch every page once, untimed
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            best = min(best, time.perf_counter() - t0)
    finally:
        torch.set_num_threads(before)
    return {"mib": mib, "threads": threads or before, "seconds": best,
            "gb_per_s": 2 * src.numel() * src.element_size() / best / 1e9}
