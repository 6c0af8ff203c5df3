"""The GGUF file's 4- and 8-bit blocks computed as llama.cpp computes them: each row of activations quantized to 8
bits per block of 32, integer dot products with the weights' codes, one float scale per block. The "q4x8" backend.

    layer = from_q4_1(codes, d, m)        # a Q4_1 block set: weight = d * code + m per block of 32 inputs
    layer = from_q8_0(q, d)               # a Q8_0 block set: weight = d * q
    y = layer(x)                          # (..., K) -> (..., N), x in fp32 or bf16

Why: torch's packed 4-bit CPU kernel multiplies in floats, so each extra row of a verify costs nearly what the first
did, and one row costs most of a decode step. With 8-bit activations the products are integer dot products (AVX-512
VNNI: 64 per instruction) and a block's codes are unpacked once for all the rows of a call.

Per row and block: ``dx = max |x| / 127``, ``qx = round(x / dx)``; then ``y[n] = sum over blocks (d * dx *
sum(code * qx) + m * dx * sum(qx))``. Every row is computed alone (the same operations in the same order whatever the
row count), so a verify's rows equal the AR steps' bit for bit. The kernel is C (``jetflow.engine.native``): AVX-512
VNNI where the processor has it, plain C elsewhere (the same answer up to float rounding order). Without a C compiler
there is no q4x8 backend (``available`` says so). ``tests/test_dot8.py`` holds it to the block formula.
"""
from __future__ import annotations

import ctypes
import functools

import torch

from . import native

SOURCE = native.PRELUDE + r"""
#if defined(__AVX512F__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#define VNNI 1
#define PREFETCH 2048  /* bytes ahead of the pass through the weights */
#endif

/* The weights, packed for one pass through memory: for each group of G outputs (G = 4 or 1) and each pair p of
   blocks of 32 inputs, the G outputs' codes of blocks 2p and 2p+1 (bits 4: 16 bytes a block, byte j = code j |
   code j+16 << 4, GGUF's order; bits 8: 32 bytes, code = q + 128), then per output d(2p), d(2p+1), m(2p), m(2p+1)
   as fp16. weight = d * code + m (4 bits); d * (code - 128) (8 bits). */

/* rows of x (T, K), row stride xs -> qx (T, K) int8, dx (T, B) and the sums of qx (T, B), B = K / 32 */
static void quantize(const void *x, long xs, int bf16, int T, int K, int8_t *qx, float *dx, int *sums) {
    int B = K / 32;
    for (int t = 0; t < T; t++)
        for (int b = 0; b < B; b++) {
            float v[32], amax = 0.f;
            for (int i = 0; i < 32; i++) {
                v[i] = load(x, t * xs + b * 32 + i, bf16);
                float a = fabsf(v[i]);
                amax = a > amax ? a : amax;
            }
            float inverse = amax > 0.f ? 127.f / amax : 0.f;
            int sum = 0;
            for (int i = 0; i < 32; i++) {
                int q = (int)nearbyintf(v[i] * inverse);
                qx[(long)t * K + b * 32 + i] = (int8_t)q;
                sum += q;
            }
            dx[(long)t * B + b] = amax / 127.f;
            sums[(long)t * B + b] = sum;
        }
}

#ifdef VNNI
typedef struct { const uint8_t *packed; int bits, G, P, K, N, unit; const int8_t *qx; const float *xs, *sv;
                 const int *corr; void *y; int bf16; } job;

static inline __m512 pair_of(const uint8_t *p) {  /* two fp16 as lanes 0-7 and 8-15 */
    const __m512i half = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
    int32_t two;
    memcpy(&two, p, 4);
    return _mm512_permutexvar_ps(half, _mm512_castps128_ps512(_mm_cvtph_ps(_mm_cvtsi32_si128(two))));
}

/* outputs of group g for rows t0 .. t0+rows-1: outs x rows independent sums, two blocks per step */
static inline __attribute__((always_inline)) void tile(const job *J, int outs, int rows, long g, int t0) {
    const __m128i nibble = _mm_set1_epi8(15);
    int size2 = J->bits == 8 ? 64 : 32;
    __m512 acc[4][4];
    for (int j = 0; j < outs; j++)
        for (int u = 0; u < rows; u++) acc[j][u] = _mm512_setzero_ps();
    for (int p = 0; p < J->P; p++) {
        const uint8_t *unit = J->packed + (g * J->P + p) * J->unit, *scales = unit + J->G * size2;
        for (int c = 0; c < J->unit; c += 64) _mm_prefetch((const char *)(unit + PREFETCH + c), _MM_HINT_T0);
        __m512i xq[4], base[4];
        __m512 xs[4], sv[4];
        for (int u = 0; u < rows; u++) {
            long tp = (long)(t0 + u) * J->P + p;
            xq[u] = _mm512_loadu_si512((const void *)(J->qx + (long)(t0 + u) * J->K + p * 64));
            xs[u] = _mm512_loadu_ps(J->xs + tp * 16);
            if (J->bits == 8) base[u] = _mm512_loadu_si512((const void *)(J->corr + tp * 16));
            else { base[u] = _mm512_setzero_si512(); sv[u] = _mm512_loadu_ps(J->sv + tp * 16); }
        }
        for (int j = 0; j < outs; j++) {
            __m512i w;
            if (J->bits == 8) w = _mm512_loadu_si512((const void *)(unit + j * 64));
            else {
                __m256i raw = _mm256_loadu_si256((const __m256i *)(unit + j * 32));
                __m128i b0 = _mm256_castsi256_si128(raw), b1 = _mm256_extracti128_si256(raw, 1);
                __m256i w0 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b0, 4), nibble), _mm_and_si128(b0, nibble));
                __m256i w1 = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b1, 4), nibble), _mm_and_si128(b1, nibble));
                w = _mm512_inserti64x4(_mm512_castsi256_si512(w0), w1, 1);
            }
            __m512 dv = pair_of(scales + j * 8), mv = J->bits == 4 ? pair_of(scales + j * 8 + 4) : dv;
            for (int u = 0; u < rows; u++) {
                __m512i dot = _mm512_dpbusd_epi32(base[u], w, xq[u]);
                acc[j][u] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(dv, xs[u]), acc[j][u]);
                if (J->bits == 4) acc[j][u] = _mm512_fmadd_ps(mv, sv[u], acc[j][u]);
            }
        }
    }
    for (int j = 0; j < outs; j++)
        for (int u = 0; u < rows; u++)
            store(J->y, (long)(t0 + u) * J->N + g * J->G + j, _mm512_reduce_add_ps(acc[j][u]), J->bf16);
}
#else
static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 31, man = h & 1023, u;
    float f;
    if (e == 0) { f = (float)man * (1.0f / 16777216.0f); return sign ? -f : f; }
    u = e == 31 ? sign | 0x7f800000 | (man << 13) : sign | ((e + 112) << 23) | (man << 13);
    memcpy(&f, &u, 4);
    return f;
}
#endif

/* y (T, N) in x's dtype = x (T, K) times the packed weights (above). Returns 0, 1 (K not a multiple of 64 or N not
   of G), 2 (out of memory). */
int jetflow_dot8_vectorized(void) {  /* 1 where the AVX-512 VNNI path was built */
#ifdef VNNI
    return 1;
#else
    return 0;
#endif
}

int jetflow_dot8(const void *x, long xs, int bf16, int T, int K, const uint8_t *packed, int bits, int G, int N,
                 void *y) {
    if (K % 64 || T <= 0 || N % G || (G != 1 && G != 4)) return 1;
    int B = K / 32, P = B / 2, size2 = bits == 8 ? 64 : 32, unit = G * (size2 + 8);
    int8_t *qx = malloc((size_t)T * K);
    float *dx = malloc(sizeof(float) * T * B);
    int *sums = malloc(sizeof(int) * T * B);
    if (!qx || !dx || !sums) { free(qx); free(dx); free(sums); return 2; }
    quantize(x, xs, bf16, T, K, qx, dx, sums);
#ifdef VNNI
    /* per row and pair: dx as 8 + 8 lanes; the 4-bit minimum's sums dx * sum(qx) in lanes 0 and 8 (else 0); for 8-bit
       codes, -128 * the sum of each lane's 4 qx (the codes' offset, taken off in the integers) */
    float *xsv = malloc(sizeof(float) * T * P * 16), *sv = calloc((size_t)T * P * 16, sizeof(float));
    int *corr = malloc(sizeof(int) * T * P * 16);
    if (!xsv || !sv || !corr) { free(qx); free(dx); free(sums); free(xsv); free(sv); free(corr); return 2; }
    for (long t = 0; t < T; t++)
        for (int p = 0; p < P; p++) {
            long o = (t * P + p) * 16;
            for (int l = 0; l < 16; l++) {
                int b = 2 * p + l / 8;
                xsv[o + l] = dx[t * B + b];
                const int8_t *q = qx + t * K + p * 64 + l * 4;
                corr[o + l] = -128 * (q[0] + q[1] + q[2] + q[3]);
            }
            sv[o] = dx[t * B + 2 * p] * (float)sums[t * B + 2 * p];
            sv[o + 8] = dx[t * B + 2 * p + 1] * (float)sums[t * B + 2 * p + 1];
        }
    job J = {packed, bits, G, P, K, N, unit, qx, xsv, sv, corr, y, bf16};
    /* groups of outputs split between threads (OpenMP where built with it; each output is computed the same way on
       any thread); small calls stay on one */
    #pragma omp parallel for schedule(static) if ((long)N * K * T >= 1L << 16)
    for (long g = 0; g < N / G; g++)
        for (int t0 = 0; t0 < T; t0 += 4) {
            int rows = T - t0 < 4 ? T - t0 : 4;
            /* constant tile sizes, so the compiler keeps the sums in registers */
            if (G == 4) {
                if (rows == 4) tile(&J, 4, 4, g, t0);
                else if (rows == 1) tile(&J, 4, 1, g, t0);
                else if (rows == 2) tile(&J, 4, 2, g, t0);
                else tile(&J, 4, 3, g, t0);
            } else {
                if (rows == 4) tile(&J, 1, 4, g, t0);
                else if (rows == 1) tile(&J, 1, 1, g, t0);
                else tile(&J, 1, rows, g, t0);
            }
        }
    free(xsv); free(sv); free(corr);
#else
    for (long g = 0; g < N / G; g++)
        for (int j = 0; j < G; j++)
            for (long t = 0; t < T; t++) {
                float acc = 0.f;
                for (int p = 0; p < P; p++) {
                    const uint8_t *unit_ = packed + (g * P + p) * unit, *c = unit_ + j * size2;
                    const uint8_t *sc = unit_ + G * size2 + j * 8;
                    for (int h = 0; h < 2; h++) {
                        int b = 2 * p + h, sum = 0;
                        const int8_t *q = qx + t * K + b * 32;
                        for (int i = 0; i < 32; i++) {
                            int code = bits == 8 ? c[h * 32 + i] - 128
                                                 : (i < 16 ? c[h * 16 + i] & 15 : c[h * 16 + i - 16] >> 4);
                            sum += code * q[i];
                        }
                        acc += (float)sum * (f16(sc + 2 * h) * dx[t * B + b]);
                        if (bits == 4) acc += f16(sc + 4 + 2 * h) * (dx[t * B + b] * (float)sums[t * B + b]);
                    }
                }
                store(y, t * N + g * G + j, acc, bf16);
            }
#endif
    free(qx); free(dx); free(sums);
    return 0;
}
"""

_ARGS = (ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
         ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
_FLAGS = ("-fopenmp",)


@functools.lru_cache(maxsize=None)
def _function():
    return native.function("dot8", SOURCE, "jetflow_dot8", _ARGS, _FLAGS)


def available() -> bool:
    """Whether the kernel builds here (a C compiler; ``JETFLOW_NATIVE`` not 0): the q4x8 backend needs it."""
    return _function() is not None


def vectorized() -> bool:
    """Whether the kernel here is the AVX-512 VNNI one (the fast one; elsewhere plain C, correct but slow)."""
    return available() and bool(native.function("dot8", SOURCE, "jetflow_dot8_vectorized", (), _FLAGS)())


def matmul(x: torch.Tensor, packed: torch.Tensor, bits: int, group: int, n: int) -> torch.Tensor:
    """x (T, K) fp32 or bf16 -> (T, N) in x's dtype: the kernel over ``packed`` (``pack``'s layout) of ``n`` outputs."""
    function = _function()
    if function is None:
        raise RuntimeError("the q4x8 kernel needs a C compiler (cc), and JETFLOW_NATIVE unset or 1")
    if x.dtype not in (torch.float32, torch.bfloat16) or x.dim() != 2 or x.device.type != "cpu":
        raise ValueError(f"x must be (T, K) fp32 or bf16 on the CPU, got {x.dtype} {tuple(x.shape)} on {x.device}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    t, k = x.shape
    if k != packed.shape[1] * 64:
        raise ValueError(f"x has {k} inputs, the blocks {packed.shape[1] * 64}")
    y = torch.empty(t, n, dtype=x.dtype)
    if t == 0:
        return y
    code = function(x.data_ptr(), x.stride(0), int(x.dtype == torch.bfloat16), t, k, packed.data_ptr(), bits, group,
                    n, y.data_ptr())
    if code:
        raise ValueError("the q4x8 kernel's shapes do not fit" if code == 1 else "out of memory")
    return y


torch.library.define("jetflow::dot8_mm", "(Tensor x, Tensor packed, int bits, int group, int n) -> Tensor")
torch.library.impl("jetflow::dot8_mm", "CPU", matmul)


@torch.library.register_fake("jetflow::dot8_mm")
def _fake(x, packed, bits, group, n):
    return x.new_empty(x.shape[0], n)


def _call(x, packed, bits, group, n):
    """The kernel straight through ctypes when eager; the op (one opaque node) inside a torch.compile trace."""
    if torch.compiler.is_compiling():
        return torch.ops.jetflow.dot8_mm(x, packed, bits, group, n)
    return matmul(x, packed, bits, group, n)


def pack(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, group: int) -> torch.Tensor:
    """codes (N, B, 16 or 32 bytes), d and m (N, B) fp16 values -> the kernel's layout (N / group, B / 2, unit bytes):
    per group of outputs and pair of blocks, their codes, then their d and m pairs as fp16."""
    n, blocks, size = codes.shape
    g, pairs = n // group, blocks // 2
    c = codes.reshape(g, group, pairs, 2 * size).permute(0, 2, 1, 3).reshape(g, pairs, group * 2 * size)
    scales = torch.stack([d.half().reshape(g, group, pairs, 2), m.half().reshape(g, group, pairs, 2)], 3)
    scales = scales.permute(0, 2, 1, 3, 4).contiguous().view(torch.uint8).reshape(g, pairs, group * 8)
    return torch.cat([c, scales], -1).contiguous()


def unpack(packed: torch.Tensor, bits: int, group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack``'s inverse: (codes (N, B, bytes), d (N, B), m (N, B)) as fp32."""
    g, pairs, _ = packed.shape
    size = 32 if bits == 8 else 16
    codes = packed[..., :group * 2 * size].reshape(g, pairs, group, 2 * size).permute(0, 2, 1, 3)
    scales = packed[..., group * 2 * size:].contiguous().view(torch.float16).reshape(g, pairs, group, 2, 2)
    scales = scales.permute(0, 2, 1, 3, 4).float()  # (g, group, pairs, d|m, 2)
    n = g * group
    return (codes.reshape(n, 2 * pairs, size), scales[..., 0, :].reshape(n, 2 * pairs),
            scales[..., 1, :].reshape(n, 2 * pairs))


class Dot8Linear(torch.nn.Module):
    """A frozen linear over GGUF-style blocks (4-bit Q4_1 or 8-bit Q8_0 codes, per-32 scale and minimum, fp16 values
    as in the file), computed with 8-bit activations (see the module docstring); ``dtype`` the activations' dtype."""

    def __init__(self, codes: torch.Tensor, bits: int, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype,
                 bias: torch.Tensor | None = None):
        super().__init__()
        n, blocks, size = codes.shape
        if bits not in (4, 8) or size != 32 * bits // 8 or d.shape != (n, blocks) or m.shape != (n, blocks):
            raise ValueError(f"blocks of {bits}-bit codes {tuple(codes.shape)}, d {tuple(d.shape)} and m "
                             f"{tuple(m.shape)} do not fit together")
        if blocks % 2:
            raise ValueError(f"the q4x8 kernel takes a multiple of 64 inputs, got {blocks * 32}")
        if not (torch.equal(d.half().float(), d.float()) and torch.equal(m.half().float(), m.float())):
            raise ValueError("block scales and minima must be fp16 values, as a GGUF file's are")
        self.kind, self.bits, self.in_features, self.out_features = "q4x8", bits, blocks * 32, n
        self.group = 4 if bits == 4 and n % 4 == 0 else 1  # 4-bit codes: four outputs per pass (measured faster)
        self.register_buffer("packed", pack(codes.to(torch.uint8), d, m, self.group))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))
        self._dtype = dtype

    @property
    def dtype(self) -> torch.dtype:
        return self._dtype

    def blocks(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(codes (N, B, bytes), d, m (N, B)) back out of the packing."""
        return unpack(self.packed, self.bits, self.group)

    @functools.cached_property
    def weight(self) -> torch.Tensor:
        """(N, K) the weights the blocks hold, in this layer's dtype (e.g. for a draft head that borrows the
        lm_head's rows)."""
        codes, d, m = self.blocks()
        if self.bits == 8:
            w = (codes.float() - 128) * d[..., None]
        else:
            w = torch.cat([codes & 15, codes >> 4], -1).float() * d[..., None] + m[..., None]
        return w.reshape(self.out_features, self.in_features).to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).to(self.dtype).contiguous()
        out = self.kernel()(flat)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def kernel(self):
        """The bare call: (T, K) rows in this layer's dtype -> (T, N) (a hot loop's linear); an op torch.compile
        sees as one opaque call."""
        if self.bias is not None:
            return self
        return functools.partial(_call, packed=self.packed, bits=self.bits, group=self.group, n=self.out_features)

    def extra_repr(self) -> str:
        return f"q4x8 ({self.bits}-bit codes), in={self.in_features}, out={self.out_features}, dtype={self.dtype}"


def from_q4_1(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, dtype: torch.dtype, bias=None) -> Dot8Linear:
    """Q4_1 blocks: codes (N, K) in 0..15, d and m (N, K / 32): weight = d * code + m."""
    n, k = codes.shape
    c = codes.to(torch.uint8).reshape(n, k // 32, 32)
    return Dot8Linear(c[..., :16] | (c[..., 16:] << 4), 4, d, m, dtype, bias)


def from_q8_0(q: torch.Tensor, d: torch.Tensor, dtype: torch.dtype, bias=None) -> Dot8Linear:
    """Q8_0 blocks: q (N, K) int8, d (N, K / 32): weight = d * q, kept as unsigned codes q + 128 (the kernel takes the
    offset back off in its integer sums)."""
    n, k = q.shape
    codes = (q.to(torch.int32) + 128).to(torch.uint8).reshape(n, k // 32, 32)
    return Dot8Linear(codes, 8, d, torch.zeros_like(d), dtype, bias)


def fuse(layers) -> Dot8Linear:
    """One layer computing ``layers`` (same input, same code width) side by side."""
    layers = list(layers)
    if len({(l.bits, l.in_features, l.dtype, l.bias is None) for l in layers}) != 1:
        raise ValueError("fuse takes q4x8 layers of one code width and dtype over the same input")
    parts = [l.blocks() for l in layers]
    bias = None if layers[0].bias is None else torch.cat([l.bias for l in layers])
    codes, d, m = (torch.cat([p[i] for p in parts]) for i in range(3))
    return Dot8Linear(codes, layers[0].bits, d, m, layers[0].dtype, bias)
