"""Small C kernels built on the user's machine: compiled once with the system's C compiler and loaded with ctypes.

    lib = native.build("row_attention", SOURCE)   # a ctypes.CDLL, or None (with one warning) where it cannot build

The kernels (``row_attention``, ``dot8``) are a few dozen lines of C each; building them here, rather than shipping
wheels, keeps the package pure Python. Each is compiled for this processor (``-O3 -march=native``) into the cache
folder (``$JETFLOW_CACHE/native``), keyed by its source, the compiler and the processor's flags, and loaded from
there by every later process. ``JETFLOW_NATIVE=0`` turns them all off (the callers then use torch ops).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import warnings

from jetflow.util.paths import cache_dir


def _machine() -> str:
    """What ``-march=native`` compiles for: the processor's flags (a shared cache folder may serve several CPUs)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.processor()


def _compile(compiler: str, source, built) -> None:
    """``source`` into the shared library ``built``; for this processor where the compiler knows how (an older
    compiler on some ARM machines refuses ``-march=native``), else generic."""
    base = [compiler, "-O3", "-shared", "-fPIC", "-o", str(built), str(source), "-lm"]
    try:
        subprocess.run(base[:2] + ["-march=native"] + base[2:], check=True, capture_output=True, text=True)
    except subprocess.CalledProcessError:
        subprocess.run(base, check=True, capture_output=True, text=True)


@functools.lru_cache(maxsize=None)
def build(name: str, source: str) -> ctypes.CDLL | None:
    """The shared library of ``source`` (built on first use on this machine, then loaded from the cache folder), or
    None, with one warning saying why, where there is no working C compiler or ``JETFLOW_NATIVE=0``."""
    if os.environ.get("JETFLOW_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC", "cc")
    key = hashlib.sha256("\0".join([source, compiler, platform.machine(), _machine()]).encode()).hexdigest()[:16]
    folder = cache_dir() / "native"
    path = folder / f"{name}-{key}.so"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            text = folder / f"{name}-{key}.{os.getpid()}.c"
            text.write_text(source)
            built = text.with_suffix(".so")
            _compile(compiler, text, built)
            os.replace(built, path)  # atomic: a process beside this one loads a whole file or builds its own
            text.unlink()
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = (getattr(err, "stderr", "") or str(err)).strip().splitlines()
        warnings.warn(f"jetflow: the C kernel {name!r} is unavailable ({detail[-1] if detail else err}); "
                      f"torch ops stand in (slower)", RuntimeWarning, stacklevel=3)
        return None
