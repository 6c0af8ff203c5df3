"""The lean forward under torch.compile: one graph per decode step for the quantized backends on a CPU.

    target = load_target(None, dtype="bfloat16", quant="q4", compile=True)   # a CompiledLeanTarget
    target.warm()                                     # its one graph compiled (or loaded), before any timing

Why: the eager lean forward (``jetflow.engine.lean``) issues a few thousand small ops per step around its
121 packed-kernel calls; one compiled graph fuses the norms, rotary and residual arithmetic into a handful of
kernels and calls the packed kernels from generated code. Attention stays outside inductor's reach, as one opaque
op (``jetflow::lean_attention``) that runs the eager exact attention (``invariant.attend``), so every row
attends exactly as the eager lean forward does; the rest of the graph is inductor's own code, so a compiled
target is its own backend ("q4-compiled"): its AR and its speculation agree token for token, while its logits
are not the eager ones bit for bit.

One graph serves a whole run: the AR step and every verify (any number of rows, any tree: the row count is an
unbacked size, so a single row is not specialized into a graph of its own). The prefill runs eager: AR and
speculation share it. Graph seconds land in ``compile_s`` (and the ``Result``), never in a decode's tokens/s;
inductor's disk caches (``compiled.use_disk_cache``) let a later process load the compiled code, and the trace of
a loop over plain tensors costs seconds, not minutes (docs/compiled.md, "The compiled lean forward").
"""
from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import torch

from .compiled import use_disk_cache
from .lean import LeanTarget, lean_target
from .target import Target

_pending: list = [None]  # (the running forward's eager attention, the cache's keys and values (layers, KVH, rows, D))

# one layer's exact attention as an op opaque to the compiler. It runs the running forward's own attention
# (``_pending``: a partial of ``LeanDecoder._attention``), which writes k/v into the layer's cache rows and reads the
# plan of keys per row. The cache is not a graph input: inductor then neither guards on it nor copies it around a
# mutation, and the op's one output orders the layers (each op's inputs come from the layer before it).
_LIBRARY = torch.library.Library("jetflow", "DEF")
_LIBRARY.define("lean_attention(Tensor q, Tensor k, Tensor v, int layer) -> Tensor")


def _attention_impl(q, k, v, layer):
    if _pending[0] is None:
        raise RuntimeError("jetflow::lean_attention runs only inside a compiled lean target's forward")
    attention, keys, values = _pending[0]
    return attention(q, k, v, keys[layer], values[layer])


def _attention_fake(q, k, v, layer):
    return torch.empty_like(q)


_LIBRARY.impl("lean_attention", _attention_impl, "CPU")
torch.library.register_fake("jetflow::lean_attention", _attention_fake, lib=_LIBRARY)


class _OpAttention:
    """``layers_pass``'s attention inside the graph: the op, for layer 0, 1, ... in call order."""

    def __init__(self):
        self.layer = 0

    def __call__(self, q, k, v, keys, values):
        out = torch.ops.jetflow.lean_attention(q, k, v, self.layer)
        self.layer += 1
        return out


def _graph_body(decoder, h, cos, sin):
    nothing = [None] * len(decoder.layers)
    return decoder.layers_pass(h, cos, sin, nothing, nothing, _OpAttention())


# the generated wrapper's per-call checks of every kernel output's size, stride and alignment, skipped: one graph
# per target, traced once, whose layouts never change between calls
OPTIONS = {"size_asserts": False, "alignment_asserts": False, "scalar_asserts": False}


@dataclass
class CompiledLeanTarget(LeanTarget):
    """A ``LeanTarget`` whose steps after the prefill run one compiled graph (see the module docstring)."""
    compile_s: dict = field(init=False, default_factory=dict)  # "layers" -> seconds of its first call
    graph: object = field(init=False, default=None, repr=False)

    def __post_init__(self):
        use_disk_cache()
        decoder = self.decoder
        self.graph = torch.compile(functools.partial(_graph_body, decoder), dynamic=False, options=OPTIONS)

    def compiled_layers(self, h, cos, sin, keys, values, attention):
        """``LeanTarget.forward``'s stand-in for ``layers_pass`` in every step but the prefill: the compiled pass
        over ``h`` (T, H). The row count is unbacked, so one row and many share one graph and every row is computed
        alike whatever the count."""
        for x in (h, cos, sin):
            torch._dynamo.decorators.mark_unbacked(x, 0)
        _pending[0] = (attention, keys, values)
        t0 = time.perf_counter()
        try:
            out = self.graph(h, cos, sin)
        finally:
            _pending[0] = None
        self.compile_s.setdefault("layers", time.perf_counter() - t0)
        return out

    def warm(self, proposers=(), *, rows: int | None = None, tree=None, shortest: int = 1) -> list[dict]:
        """Compile (or load) the graph on a throwaway prefix, before any timing; the arguments are
        ``CompiledTarget.warm``'s (one graph serves every size and tree here, so they change nothing). Returns one
        row per graph compiled or loaded by this call ({"graph", "size", "seconds"}; size None: any)."""
        if self.compile_s:
            return []
        cache = self.new_cache()
        ids = torch.zeros(4, dtype=torch.long)
        self.forward(ids, cache)
        self.forward(ids[:1], cache)
        return [{"graph": "target", "size": None, "seconds": self.compile_s["layers"]}]

    def draft_proposer(self, proposer):
        """The proposer as it is: a head drafts eagerly beside the compiled lean target."""
        return proposer


def compile_lean(target: Target) -> CompiledLeanTarget:
    """``target`` (an eager Target or LeanTarget of a Llama model) decoding through the compiled lean forward."""
    if isinstance(target, CompiledLeanTarget):
        return target
    lean = lean_target(target)
    return CompiledLeanTarget(lean.model, lean.tokenizer, lean.name, dict(lean.chat_kwargs), decoder=lean.decoder)
