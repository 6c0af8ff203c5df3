"""Exact attention for the lean forward, one query row at a time in C: the same answer for a row whatever else the
call carries, without torch's per-row gather of the prefix.

    out = row_attention(q, k, v, keys, values, past, visible, scaling)   # None where the kernel is not available

Why: ``invariant.attend`` makes a verify's rows equal the AR steps' by giving every row its own padded copy of the
keys it reads, a dozen small torch ops per layer; on the embedded q4 target those ops took about a fifth of an AR
step, and a 17-row verify copied the prefix 17 times per layer. The kernel below computes each row alone, with fp32
scores, softmax and weighted sum over the keys the row may read, in cache order. A tree row's keys (the prefix, then
its ancestors, then itself) come in the same order and with the same values as the AR step's at that node, so the row
is the AR step's bit for bit by construction; ``tests/test_row_attention.py`` checks that, and the lean and
lean-compiled tests check whole trees against AR.

The C source is compiled once per machine (``jetflow.engine.native``) and loaded with ctypes. Where there is no
compiler, or ``JETFLOW_ROW_ATTENTION=0`` or ``JETFLOW_NATIVE=0`` (or inside ``with switched(False)``),
``row_attention`` returns None and the lean forward attends through ``invariant.attend`` as before: both are exact,
but they round differently, so a backend's tokens can differ between the two (each equals its own AR).
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os

import torch

from . import native

SOURCE = native.PRELUDE + r"""
#define LANES 16
#define MAX_DIM 512
#define MAX_GROUP 16

/* a . b over d floats: LANES partial sums, then halved pairwise (the same order for every call) */
static inline float dot(const float *a, const float *b, int d) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= d; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += a[i + l] * b[i + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    float s = acc[0];
    for (; i < d; i++) s += a[i] * b[i];
    return s;
}

/* q (T, H, D), k and v (T, KVH, D), each with a row stride and a head stride in elements (the last dim contiguous),
   fp32 or bf16 alike; keys and values one layer of the cache, (KVH, cap, D) fp32 contiguous: the new rows' k and v are
   written at rows past .. past+T-1 first. visible: (T, past+T) bytes, row r reads key j where visible[r][j] != 0; or
   NULL: causal (row r reads keys 0 .. past+r). out (T, H, D) contiguous, the query's dtype.
   Returns 0, or 1 (no room in the cache), 2 (a head dim or group too large), 3 (out of memory). */
int jetflow_row_attention(const void *q, long qs_t, long qs_h, const void *k, long ks_t, long ks_h,
                          const void *v, long vs_t, long vs_h, int bf16, float *keys, float *values, long cap,
                          long past, int t, int heads, int kv_heads, int dim, const uint8_t *visible, float scaling,
                          void *out) {
    if (past + t > cap || kv_heads <= 0 || heads % kv_heads) return 1;
    int group = heads / kv_heads;
    if (dim > MAX_DIM || group > MAX_GROUP) return 2;
    long length = past + t;
    for (int r = 0; r < t; r++)
        for (int g = 0; g < kv_heads; g++) {
            float *kr = keys + ((long)g * cap + past + r) * dim, *vr = values + ((long)g * cap + past + r) * dim;
            for (int d = 0; d < dim; d++) {
                kr[d] = load(k, r * ks_t + g * ks_h + d, bf16);
                vr[d] = load(v, r * vs_t + g * vs_h + d, bf16);
            }
        }
    float *scores = malloc(sizeof(float) * group * length);
    long *index = malloc(sizeof(long) * length);
    if (!scores || !index) { free(scores); free(index); return 3; }
    float qf[MAX_GROUP][MAX_DIM], acc[MAX_GROUP][MAX_DIM];
    for (int r = 0; r < t; r++) {
        long n = 0, seen = visible ? length : past + r + 1;
        for (long j = 0; j < seen; j++)
            if (!visible || visible[(long)r * length + j]) index[n++] = j;
        for (int g = 0; g < kv_heads; g++) {
            const float *kg = keys + (long)g * cap * dim, *vg = values + (long)g * cap * dim;
            float m[MAX_GROUP], sum[MAX_GROUP];
            for (int h = 0; h < group; h++) {
                for (int d = 0; d < dim; d++) qf[h][d] = load(q, r * qs_t + (g * group + h) * qs_h + d, bf16) * scaling;
                m[h] = -INFINITY;
                sum[h] = 0.f;
                for (int d = 0; d < dim; d++) acc[h][d] = 0.f;
            }
            for (long i = 0; i < n; i++) {
                const float *kj = kg + index[i] * dim;
                for (int h = 0; h < group; h++) {
                    float s = dot(qf[h], kj, dim);
                    scores[h * n + i] = s;
                    if (s > m[h]) m[h] = s;
                }
            }
            for (int h = 0; h < group; h++)
                for (long i = 0; i < n; i++) {
                    float e = expf(scores[h * n + i] - m[h]);
                    scores[h * n + i] = e;
                    sum[h] += e;
                }
            for (long i = 0; i < n; i++) {
                const float *vj = vg + index[i] * dim;
                for (int h = 0; h < group; h++) {
                    float p = scores[h * n + i] / sum[h];
                    for (int d = 0; d < dim; d++) acc[h][d] += p * vj[d];
                }
            }
            for (int h = 0; h < group; h++) {
                long o = ((long)r * heads + g * group + h) * dim;
                for (int d = 0; d < dim; d++) store(out, o + d, acc[h][d], bf16);
            }
        }
    }
    free(scores);
    free(index);
    return 0;
}
"""

ERRORS = {1: "the cache has no room for the rows, or the heads do not split into the KV heads",
          2: "a head dim over 512 or more than 16 query heads per KV head", 3: "out of memory"}
_ARGS = (ctypes.c_void_p, ctypes.c_long, ctypes.c_long) * 3 + (ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
         ctypes.c_long, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
         ctypes.c_float, ctypes.c_void_p)
_switch = [True]  # ``switched``'s state: False sends every forward to the torch ops


@functools.lru_cache(maxsize=None)
def library():
    """The kernel's C function (built once per machine), or None where there is no compiler or
    ``JETFLOW_ROW_ATTENTION=0``."""
    if os.environ.get("JETFLOW_ROW_ATTENTION", "1") == "0":
        return None
    return native.function("row_attention", SOURCE, "jetflow_row_attention", _ARGS)


def available(dtype: torch.dtype | None = None) -> bool:
    """Whether ``row_attention`` runs (for queries of ``dtype``, where given: fp32 or bf16): a C compiler was found,
    ``JETFLOW_ROW_ATTENTION`` is not 0 and no ``switched`` block turned it off."""
    return (_switch[0] and library() is not None
            and (dtype is None or dtype in (torch.float32, torch.bfloat16)))


@contextlib.contextmanager
def switched(on: bool):
    """Within the block, the lean forward attends through the C kernel (on, where available) or through
    ``invariant.attend`` (off), e.g. to compare the two."""
    before = _switch[0]
    _switch[0] = on
    try:
        yield
    finally:
        _switch[0] = before


def _strided(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                  past: int, visible: torch.Tensor | None, scaling: float) -> torch.Tensor | None:
    """q (T, H, D) and k, v (T, KVH, D), all fp32 or all bf16 on the CPU; ``keys``/``values`` one layer's cache
    (KVH, rows, D) fp32, contiguous, with room for ``past + T`` rows: k and v are written at rows past..past+T-1.
    ``visible`` (T, past + T) bool: which keys each row reads, or None: causal. -> (T, H, D) in q's dtype, or None
    where the kernel is not available or the inputs are not what it takes (the caller attends another way)."""
    function = library() if _switch[0] else None
    dtype = q.dtype
    if (function is None or dtype not in (torch.float32, torch.bfloat16) or k.dtype != dtype or v.dtype != dtype
            or q.device.type != "cpu" or keys.dtype != torch.float32 or not keys.is_contiguous()
            or not values.is_contiguous()):
        return None
    q, k, v = _strided(q), _strided(k), _strided(v)
    t, heads, dim = q.shape
    if k.shape != v.shape or k.shape[0] != t or k.shape[2] != dim or keys.shape != values.shape \
            or keys.shape[0] != k.shape[1] or keys.shape[2] != dim:
        raise ValueError(f"row attention: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)} and the cache "
                         f"{tuple(keys.shape)} do not fit together")
    if visible is not None:
        if visible.shape != (t, past + t):
            raise ValueError(f"visible must be (rows, past + rows) = {(t, past + t)}, got {tuple(visible.shape)}")
        visible = visible.to(torch.bool).contiguous()
    out = torch.empty(t, heads, dim, dtype=dtype)
    code = function(q.data_ptr(), q.stride(0), q.stride(1), k.data_ptr(), k.stride(0), k.stride(1), v.data_ptr(),
                    v.stride(0), v.stride(1), int(dtype == torch.bfloat16), keys.data_ptr(), values.data_ptr(),
                    keys.shape[1], past, t, heads, k.shape[1], dim,
                    None if visible is None else visible.data_ptr(), scaling, out.data_ptr())
    if code:
        raise ValueError(f"row attention: {ERRORS.get(code, code)} (q {tuple(q.shape)}, k {tuple(k.shape)}, cache "
                         f"{tuple(keys.shape)}, past {past})")
    return out
