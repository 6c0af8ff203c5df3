"""Weight-only quantized linears through torch's native CPU kernels: int8 per channel, and 4-bit blocks
that carry a GGUF file's own Q4_1 (and Q8_0) weights exactly.

    target = load_target(None, dtype="bfloat16", quant="q4")    # jetflow.engine.load builds it through here
    quantize_model(model, "int8")                               # any model: every nn.Linear, lm_head included

- ``int8``: each linear's weight requantized symmetrically per output channel (scale = max |w| / 127) and
  run by ``torch.ops.aten._weight_int8pack_mm``. Lossy against the float weights; lossless speculation
  holds against this backend's own AR, like every backend.
- ``q4``: groups of 32 inputs with a scale and a minimum, run by ``_weight_int4pack_mm_for_cpu`` (codes
  packed by ``_convert_weight_to_int4pack_for_cpu``). The kernel computes ``(code - 8) * scale + zero``,
  so a Q4_1 block (``d * q + m``) is ``scale = d, zero = m + 8 d``; a Q8_0 block (``d * q``, q in -128..127,
  the file's tied embedding / lm_head) is two 4-bit halves, ``q = 16 hi + lo``, laid side by side along
  the input (the input duplicated): one kernel call. From the GGUF file (``gguf_q4_blocks``) the 4-bit
  codes, scales and minimums are the file's; a model without a file gets Q4_1 blocks of its own weights
  (``q4_1_blocks``, min/max per 32). In fp32 the kernel's weights equal the dequantized file exactly
  (tested, max error 0.0); in bf16 the scales and zeros are rounded to bf16 (the kernels' fast path).
- ``q4x8``: the same file blocks computed as llama.cpp computes them, activations quantized to 8 bits per block of
  32 and integer dot products (``jetflow.engine.dot8``, a C kernel built on this machine).

The kernels are fast at a few rows and only with bf16 activations: fp32 inputs run 10-40x slower
(docs/compiled.md). Both ops have meta kernels, so the modules run under ``torch.compile`` too.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import torch

from . import dot8

QUANTS = ("int8", "q4", "q4x8")  # the quantized backends; None = the float weights
GROUP = 32               # inputs per 4-bit group (a GGUF block)
PACK_ROWS = 64           # output rows per block of the CPU int4 packing (``fuse`` concatenates whole blocks)
QUANT_HELP = ("weight-only quantized linears, lm_head included: int8 (per channel), q4 (the GGUF's own Q4_1 "
              "blocks; docs/compiled.md) or q4x8 (the same blocks times 8-bit activations, as llama.cpp computes "
              "them; docs/speed.md); default none")


class QuantLinear(torch.nn.Module):
    """A frozen linear computed by a packed int8 or int4 kernel in the activations' dtype (``dtype``)."""

    def __init__(self, kind: str, weight: torch.Tensor, scales: torch.Tensor, out_features: int,
                 in_features: int, bias: torch.Tensor | None = None, repeat: int = 1):
        super().__init__()
        if kind not in QUANTS:
            raise ValueError(f"quant must be one of {QUANTS}, got {kind!r}")
        self.kind, self.in_features, self.out_features, self.repeat = kind, in_features, out_features, repeat
        self.register_buffer("weight_packed", weight)
        self.register_buffer("scales", scales)  # int8: (N,); q4: (K * repeat / 32, N, 2) scale and zero
        self.register_buffer("bias", bias)

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    @functools.cached_property
    def weight(self) -> torch.Tensor:
        """(N, K) the weights this layer computes with, in its dtype (read once, e.g. by a draft head that
        borrows the lm_head's rows)."""
        return dequantize(self).to(self.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, self.in_features).to(self.scales.dtype)
        if self.repeat > 1:
            flat = flat.repeat(1, self.repeat)
        if self.kind == "int8":
            out = torch.ops.aten._weight_int8pack_mm(flat, self.weight_packed, self.scales)
        else:
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.weight_packed, GROUP, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).reshape(*shape[:-1], self.out_features)

    def kernel(self):
        """The bare call: (T, K) rows in this layer's dtype -> (T, N), no reshapes or casts (a hot loop's linear)."""
        if self.repeat != 1 or self.bias is not None:
            return self
        if self.kind == "int8":
            return functools.partial(torch.ops.aten._weight_int8pack_mm, mat2=self.weight_packed, scales=self.scales)
        return functools.partial(torch.ops.aten._weight_int4pack_mm_for_cpu, mat2=self.weight_packed,
                                 qGroupSize=GROUP, qScaleAndZeros=self.scales)

    def extra_repr(self) -> str:
        return f"{self.kind}, in={self.in_features}, out={self.out_features}, dtype={self.dtype}"


def int8_linear(weight: torch.Tensor, bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32
                ) -> QuantLinear:
    """``weight`` (N, K) requantized to int8 per output channel (symmetric, scale = max |w| / 127)."""
    w = weight.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return QuantLinear("int8", q.contiguous(), scale.to(dtype), w.shape[0], w.shape[1],
                       None if bias is None else bias.detach().to(dtype))


def q4_linear(codes: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, in_features: int,
              bias: torch.Tensor | None = None, dtype: torch.dtype = torch.float32) -> QuantLinear:
    """The 4-bit linear of ``codes`` (N, K * r) in 0..15 with per-32 ``scale`` and ``zero`` (N, K * r / 32):
    weight[n, k] = sum over the r copies of (code - 8) * scale + zero (the kernel's own formula)."""
    n, width = codes.shape
    if width % GROUP or width % in_features or scale.shape != (n, width // GROUP) or zero.shape != scale.shape:
        raise ValueError(f"codes {tuple(codes.shape)}, scale {tuple(scale.shape)} and zero {tuple(zero.shape)} "
                         f"do not make groups of {GROUP} over {in_features} inputs")
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).contiguous(), 1)
    sz = torch.stack([scale, zero], -1).transpose(0, 1).contiguous().to(dtype)  # (K r / 32, N, 2)
    return QuantLinear("q4", packed, sz, n, in_features, None if bias is None else bias.detach().to(dtype),
                       repeat=width // in_features)


def q4_1_blocks(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_1-style blocks of ``weight`` (N, K): (codes (N, K) in 0..15, d, m (N, K / 32)), w ~ d * code + m,
    d and m rounded to fp16 as in a GGUF file (for models that come without one: tests, hub ids)."""
    w = weight.detach().float().reshape(weight.shape[0], -1, GROUP)
    lo, hi = w.amin(-1), w.amax(-1)
    d = ((hi - lo) / 15).half().float()
    m = lo.half().float()
    safe = torch.where(d == 0, torch.ones_like(d), d)
    codes = torch.round((w - m[..., None]) / safe[..., None]).clamp(0, 15)
    return codes.reshape(weight.shape).to(torch.uint8), d, m


def from_q4_1(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor, in_features: int, **kw) -> QuantLinear:
    """A Q4_1 block set (value = d * code + m) as the kernel's scale d and zero m + 8 d."""
    return q4_linear(codes, d, m + 8 * d, in_features, **kw)


def from_q8_0(q: torch.Tensor, d: torch.Tensor, **kw) -> QuantLinear:
    """A Q8_0 block set (value = d * q, q int8 (N, K), d (N, K / 32)) exactly, as two 4-bit halves side by
    side: q = 16 hi + lo with lo in 0..15 (scale d, zero 8 d) and hi + 8 in 0..15 (scale 16 d, zero 0)."""
    q = q.to(torch.int32)
    lo, hi = q & 15, (q >> 4) + 8  # arithmetic shift: hi in -8..7
    codes = torch.cat([hi, lo], 1)
    return q4_linear(codes, torch.cat([16 * d, d], 1), torch.cat([torch.zeros_like(d), 8 * d], 1), q.shape[1], **kw)


def fuse(layers) -> torch.nn.Module:
    """One linear computing ``layers`` (same input) side by side: its output is theirs concatenated, one kernel call
    instead of several. Packed layers keep their packing (the int4 codes are packed per block of output rows, so
    layers concatenate in whole blocks of ``PACK_ROWS``); float ``nn.Linear`` layers get their weights concatenated."""
    layers = list(layers)
    first = layers[0]
    if len({(type(l), l.in_features, getattr(l, "kind", None), getattr(l, "repeat", 1)) for l in layers}) != 1:
        raise ValueError("fuse takes linears of one kind over the same input")
    if len({l.bias is None for l in layers}) != 1:
        raise ValueError("fuse takes linears that all have a bias or none")
    bias = None if first.bias is None else torch.cat([l.bias for l in layers]).detach()
    if isinstance(first, torch.nn.Linear):
        out = torch.nn.Linear(first.in_features, sum(l.out_features for l in layers), bias=bias is not None,
                              dtype=first.weight.dtype, device=first.weight.device)
        out.weight.data = torch.cat([l.weight.detach() for l in layers])
        if bias is not None:
            out.bias.data = bias
        return out.requires_grad_(False)
    if isinstance(first, dot8.Dot8Linear):
        return dot8.fuse(layers)
    if not isinstance(first, QuantLinear):
        raise ValueError(f"fuse takes nn.Linear, QuantLinear or Dot8Linear layers, got {type(first).__name__}")
    if first.kind == "q4" and any(l.out_features % PACK_ROWS for l in layers[:-1]):
        raise ValueError(f"q4 layers fuse where every one but the last has a multiple of {PACK_ROWS} output rows "
                         f"(the kernel packs rows in blocks of {PACK_ROWS}), got {[l.out_features for l in layers]}")
    scales = torch.cat([l.scales for l in layers], 0 if first.kind == "int8" else 1)
    return QuantLinear(first.kind, torch.cat([l.weight_packed for l in layers]), scales,
                       sum(l.out_features for l in layers), first.in_features, bias, repeat=first.repeat)


def dequantize(layer: QuantLinear) -> torch.Tensor:
    """The (N, K) weights ``layer`` computes with, read back through its own kernel (an identity input)."""
    out = layer(torch.eye(layer.in_features, dtype=layer.dtype))
    return (out if layer.bias is None else out - layer.bias).T.float()


# ----------------------------------------------------------------------------- the GGUF file's blocks
GGUF_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj"}


def _rows_order(n_rows: int, n_head: int) -> torch.Tensor:
    """The row order transformers' GGUF loader gives a Llama q/k weight (it undoes llama.cpp's permutation)."""
    dim = n_rows // n_head // 2
    return torch.arange(n_rows).reshape(n_head, dim, 2).transpose(1, 2).reshape(n_rows)


def gguf_blocks(path: str | Path) -> dict[str, tuple]:
    """Module name -> (kind, blocks) of every Q4_1 / Q8_0 weight in a Llama GGUF file: ("q4_1", codes, d, m)
    or ("q8_0", q, d), rows in transformers' order; the tied token embedding is the lm_head."""
    from gguf import GGUFReader  # the optional reader, as transformers' GGUF loading needs it too
    reader = GGUFReader(str(path))
    heads = {k: int(reader.fields[f"llama.{k}"].parts[-1][0]) for k in ("attention.head_count",
                                                                      "attention.head_count_kv")}
    out = {}
    for t in reader.tensors:
        kind = t.tensor_type.name
        match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", t.name)
        if kind not in ("Q4_1", "Q8_0") or not (match or t.name in ("token_embd.weight", "output.weight")):
            continue
        raw = np.asarray(t.data).reshape(t.data.shape[0], -1, 20 if kind == "Q4_1" else 34)
        d = torch.from_numpy(raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
        if kind == "Q4_1":
            m = torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
            qs = torch.from_numpy(raw[..., 4:].astype(np.int32))
            blocks = [torch.cat([qs & 15, qs >> 4], -1).reshape(qs.shape[0], -1), d, m]
        else:
            blocks = [torch.from_numpy(raw[..., 2:].copy().view(np.int8).astype(np.int32)).reshape(raw.shape[0], -1), d]
        if match is None:
            name = "lm_head"
        else:
            name = f"model.layers.{match[1]}.{GGUF_NAMES[match[2]]}"
            if match[2] in ("attn_q", "attn_k"):
                order = _rows_order(blocks[0].shape[0], heads["attention.head_count" + ("_kv" if match[2] == "attn_k" else "")])
                blocks = [b[order] for b in blocks]
        out[name] = (kind.lower(), *blocks)
    return out


# ----------------------------------------------------------------------------- a whole model
def quant_layer(kind: str, name: str, linear: torch.nn.Linear, blocks: dict, dtype: torch.dtype) -> torch.nn.Module:
    """The quantized counterpart of the model's ``linear`` called ``name``: int8 of its weights, or q4 / q4x8 from
    the file's blocks of that name when ``blocks`` holds them (else Q4_1 blocks of its own weights)."""
    bias = linear.bias
    if kind == "int8":
        return int8_linear(linear.weight, bias, dtype)
    file_kind, *b = blocks.get(name) or ("q4_1", *q4_1_blocks(linear.weight))
    if kind == "q4x8":
        return (dot8.from_q8_0 if file_kind == "q8_0" else dot8.from_q4_1)(*b, dtype=dtype, bias=bias)
    if file_kind == "q8_0":
        return from_q8_0(*b, bias=bias, dtype=dtype)
    return from_q4_1(*b, linear.in_features, bias=bias, dtype=dtype)


def quantize_model(model: torch.nn.Module, kind: str, gguf_file: str | Path | None = None) -> torch.nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place; lm_head included, the input embedding kept) by a
    ``QuantLinear`` (a ``dot8.Dot8Linear`` for q4x8) of ``kind`` computing in the model's dtype; q4 and q4x8 take
    the blocks of ``gguf_file`` where it has them. Returns ``model``."""
    if kind not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {kind!r}")
    if model.get_input_embeddings().weight.device.type != "cpu":
        raise ValueError("the quantized linears run torch's CPU kernels: load the target on the CPU")
    dtype = model.get_input_embeddings().weight.dtype
    if kind == "q4x8" and not dot8.available():
        raise ValueError("q4x8 needs its C kernel, which needs a C compiler (cc) here: use q4")
    blocks = gguf_blocks(gguf_file) if kind in ("q4", "q4x8") and gguf_file is not None else {}
    names = [n for n, mod in model.named_modules() if isinstance(mod, torch.nn.Linear)]
    for name in names:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        setattr(owner, leaf, quant_layer(kind, name, getattr(owner, leaf), blocks, dtype))
    return model
