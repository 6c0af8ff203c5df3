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

# What every kernel's source starts with: the headers, and a float or bf16 element read or written as a float (bf16
# rounded to nearest even, NaN kept), so one kernel serves both dtypes.
PRELUDE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float load(const void *p, long i, int bf16) {
    if (bf16) { uint32_t u = ((uint32_t)((const uint16_t *)p)[i]) << 16; float f; memcpy(&f, &u, 4); return f; }
    return ((const float *)p)[i];
}

static inline void store(void *p, long i, float f, int bf16) {
    if (bf16) {
        uint32_t u; memcpy(&u, &f, 4);
        if ((u & 0x7fffffff) > 0x7f800000) u |= 0x00400000;      /* NaN stays NaN */
        else u += 0x7fff + ((u >> 16) & 1);                       /* round to nearest even */
        ((uint16_t *)p)[i] = (uint16_t)(u >> 16);
    } else ((float *)p)[i] = f;
}
"""



def _machine() -> str:
    """What ``-march=native`` compiles for: the processor's flags (a shared cache folder may serve several CPUs)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith(("flags", "Features"))), platform.processor())
    except OSError:
        return platform.processor()


def _compile(compiler: str, source, built, flags: tuple[str, ...]) -> None:
    """``source`` into the shared library ``built``: for this processor and with ``flags`` where the compiler takes
    them (an older compiler on some ARM machines refuses ``-march=native``; clang may lack OpenMP), else without."""
    base = [compiler, "-O3", "-shared", "-fPIC", "-o", str(built), str(source), "-lm"]
    for extra in (["-march=native", *flags], ["-march=native"], []):
        try:
            subprocess.run(base[:2] + extra + base[2:], check=True, capture_output=True, text=True)
            return
        except subprocess.CalledProcessError:
            if not extra:
                raise


@functools.lru_cache(maxsize=None)
def build(name: str, source: str, flags: tuple[str, ...] = ()) -> ctypes.CDLL | None:
    """The shared library of ``source`` (built on first use on this machine, then loaded from the cache folder), or
    None, with one warning saying why, where there is no working C compiler or ``JETFLOW_NATIVE=0``. ``flags``: extra
    compiler flags, dropped where the compiler refuses them (e.g. ``-fopenmp``: OpenMP threads are torch's own, the
    process has one OpenMP runtime, so ``torch.set_num_threads`` sets the kernels' threads too)."""
    if os.environ.get("JETFLOW_NATIVE", "1") == "0":
        return None
    compiler = os.environ.get("CC", "cc")
    identity = "\0".join([source, compiler, platform.machine(), _machine(), *flags])
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    folder = cache_dir() / "native"
    path = folder / f"{name}-{key}.so"
    try:
        if not path.exists():
            folder.mkdir(parents=True, exist_ok=True)
            text = folder / f"{name}-{key}.{os.getpid()}.c"
            text.write_text(source)
            built = text.with_suffix(".so")
            _compile(compiler, text, built, flags)
            os.replace(built, path)  # atomic: a process beside this one loads a whole file or builds its own
            text.unlink()
        return ctypes.CDLL(str(path))
    except (OSError, subprocess.CalledProcessError) as err:
        detail = (getattr(err, "stderr", "") or str(err)).strip().splitlines()
        warnings.warn(f"jetflow: the C kernel {name!r} is unavailable ({detail[-1] if detail else err}); "
                      f"torch ops stand in (slower)", RuntimeWarning, stacklevel=3)
        return None


def function(name: str, source: str, symbol: str, argtypes: tuple, flags: tuple[str, ...] = ()):
    """The C function ``symbol`` of ``build(name, source, flags)``, its argument types set and returning an int, or
    None where the library does not build."""
    lib = build(name, source, flags)
    if lib is None:
        return None
    found = getattr(lib, symbol)
    found.argtypes, found.restype = list(argtypes), ctypes.c_int
    return found
