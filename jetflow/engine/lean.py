"""A Llama decoder's forward written out over the target's own modules: the CPU decode path of the quantized backends.

    target = load_target(None, dtype="bfloat16", quant="q4")   # a LeanTarget: load_eager builds it for int8/q4/q4x8
    lean_target(target)                                          # any eager Target of a Llama model

Why it exists: on the embedded q4 target one AR step through transformers' module stack cost about 24 ms on one core
of an AMD EPYC, a third of it inside the packed 4-bit kernels; the rest was module calls, wrappers, output capture and small tensor
ops. Through this file it costs about 16 ms (``tools/lean_forward.py``; docs/speed.md, "The lean forward"). It calls
the same modules' weights with a few dozen ops per layer: q/k/v and gate/up each one fused kernel call
(``jetflow.engine.quant.fuse``), keys and values written once, in fp32, into a preallocated cache (``LeanKV``), and
exact attention, so a verify's rows equal the AR steps' bit for bit: the C row kernel
(``jetflow.engine.row_attention``) where it builds, else ``jetflow.engine.invariant.attend`` as on the transformers
path. It breaks the house rule of talking to the target only through transformers (docs/architecture.md says why):
tests/test_lean.py holds it to transformers' forward on tiny models (bit for bit through ``invariant.attend``, to
rounding through the C kernel) and to its own AR steps bit for bit, and ``tools/lean_forward.py`` compares the two
forwards' logits on the embedded target.

What it serves: Llama-architecture models (``unsupported`` says why another is refused), batch one, eager. The prefill
attends with SDPA (AR and speculation share it). ``sequence_taps`` and training keep transformers' path.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .invariant import BUCKET, Plan, attend, visible_keys
from .quant import fuse
from .row_attention import available as row_attention_available, row_attention
from .target import Step, Target, move_rows

ROWS = 256  # the cache's first capacity; it doubles as a sequence grows


def unsupported(model: torch.nn.Module) -> str | None:
    """Why the lean forward cannot run ``model`` (None if it can): it knows the Llama decoder layer alone."""
    config = model.config
    if getattr(config, "model_type", None) != "llama":
        return f"model type {getattr(config, 'model_type', None)!r} (the lean forward knows 'llama')"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (the lean forward computes silu)"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    return None


class LeanKV:
    """The lean target's cache: keys and values (layers, KVH, rows, D) in fp32 (what exact attention reads), the live
    length, and ``keep_path`` compaction as ``target.keep_path`` does it on a dynamic cache."""

    def __init__(self, layers: int, kv_heads: int, dim: int, device, rows: int = ROWS):
        self.keys = torch.zeros(layers, kv_heads, rows, dim, device=device)
        self.values = torch.zeros_like(self.keys)
        self.length = 0

    def get_seq_length(self) -> int:
        return self.length

    def reserve(self, rows: int) -> None:
        """Room for ``rows`` rows in all (grown by doubling; the live rows copied)."""
        have = self.keys.shape[2]
        if rows <= have:
            return
        size = max(rows, 2 * have)
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros(*old.shape[:2], size, old.shape[3])
            new[:, :, :self.length] = old[:, :, :self.length]
            setattr(self, name, new)

    def keep_path(self, past_len: int, path: list[int]) -> None:
        """Keep the first ``past_len`` rows plus the tree rows ``path`` (after the prefix, in order)."""
        if path != list(range(len(path))):
            move_rows(self.keys, past_len, path)
            move_rows(self.values, past_len, path)
        self.length = past_len + len(path)


def _norm(x: torch.Tensor, norm: torch.nn.Module) -> torch.Tensor:
    """Llama's RMS norm, in its own order of operations: fp32 statistics, the weight applied in the input's dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * h.to(x.dtype)


def _rotary(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin (T, D) as the two factors of ``x * cos + roll(x, D / 2) * sin`` over (T, heads, D): the rotary
    embedding with rotate_half's negation moved onto sin's first half (a sign flip, exact)."""
    half = sin.shape[-1] // 2
    return cos[:, None], torch.cat([-sin[:, :half], sin[:, half:]], -1)[:, None]


@dataclass
class _Layer:
    qkv: object         # (T, H) -> (T, (heads + 2 KVH) D): q, k and v in one kernel call
    o: object
    gate_up: object     # gate and up in one call
    down: object
    norms: tuple[torch.nn.Module, torch.nn.Module]


def _kernel(linear: torch.nn.Module):
    """The bare (T, K) -> (T, N) call of a linear: a packed layer's kernel, or the float layer itself."""
    return linear.kernel() if hasattr(linear, "kernel") else linear


def _fused(linears) -> object:
    """One call computing ``linears`` side by side: fused (``quant.fuse``) where their packing allows, else each
    called in turn and the outputs concatenated (tiny test models whose rows are not whole packing blocks)."""
    try:
        return _kernel(fuse(linears))
    except ValueError:
        kernels = [_kernel(l) for l in linears]
        return lambda x: torch.cat([k(x) for k in kernels], -1)


class LeanDecoder:
    """The fused layers of one model (built once per model and shared by its targets)."""

    def __init__(self, model: torch.nn.Module):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"the lean forward cannot run {type(model).__name__}: {why}")
        config, inner = model.config, model.get_decoder()
        self.embed, self.final_norm, self.rotary = inner.embed_tokens, inner.norm, inner.rotary_emb
        self.lm_head = model.get_output_embeddings()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.layers.append(_Layer(_fused((attn.q_proj, attn.k_proj, attn.v_proj)), _kernel(attn.o_proj),
                                      _fused((mlp.gate_proj, mlp.up_proj)), _kernel(mlp.down_proj),
                                      (layer.input_layernorm, layer.post_attention_layernorm)))
        self.scaling = self.dim ** -0.5

    def new_cache(self) -> LeanKV:
        return LeanKV(len(self.layers), self.kv_heads, self.dim, self.embed.weight.device)

    def _attention(self, q, k, v, keys, values, past: int, groups, contiguous: bool, visible=None,
                   prefill: bool = False) -> torch.Tensor:
        """q (T, H, D), k/v (T, KVH, D) of one layer, written at rows past..past+T of its cache ``keys``/``values``
        (KVH, rows, D) -> (T, H, D). The causal ``prefill`` over an empty cache attends with SDPA; every other forward
        exactly: through the C row attention (``visible`` its (T, past + T) mask, None: causal) where it runs, else
        through ``invariant.attend`` over the ``Plan``'s ``groups``."""
        t = q.shape[0]
        if not prefill and groups is None:  # ``forward`` chose the C kernel (``row_attention.available``)
            return row_attention(q, k, v, keys, values, past, visible, self.scaling)
        keys[:, past:past + t] = k.transpose(0, 1)
        values[:, past:past + t] = v.transpose(0, 1)
        if prefill:  # causal, any kernel (AR and speculation share it)
            out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                 v.transpose(0, 1)[None], is_causal=True, scale=self.scaling,
                                                 enable_gqa=True)
            return out[0].transpose(0, 1)
        if len(groups) == 1:
            _, idx, masked = groups[0]
            if contiguous:  # the same keys as the gather below, in the same shape, without the copy
                size = idx.shape[1]
                return attend(q, keys[:, None, :size], values[:, None, :size], masked, self.scaling)
            return attend(q, keys[:, idx], values[:, idx], masked, self.scaling)
        out = torch.empty_like(q)
        for rows, idx, masked in groups:
            out[rows] = attend(q[rows], keys[:, idx], values[:, idx], masked, self.scaling)
        return out

    def layers_pass(self, h, cos, sin, keys, values, attention):
        """The decoder layers over ``h`` (T, H) with rotary factors ``cos``/``sin`` and the cache's ``keys``/``values``
        (layers, KVH, rows, D); ``attention(q, k, v, keys[i], values[i])`` attends one layer's rows and writes their keys and values into that layer's cache ->
        (the last layer's output, every layer's output). It reads nothing else that changes between calls, so
        ``jetflow.engine.lean_compiled`` hands it to torch.compile as it is, with an attention of its own."""
        t = h.shape[0]
        heads, kv, dim = self.heads, self.kv_heads, self.dim
        hidden = []
        for index, layer in enumerate(self.layers):
            qkv = layer.qkv(_norm(h, layer.norms[0])).view(t, heads + 2 * kv, dim)
            qk = qkv[:, :heads + kv]
            half = dim // 2  # roll by half the head: the halves swapped (cat: no numel check on unbacked rows)
            qk = qk * cos + torch.cat([qk[..., half:], qk[..., :half]], -1) * sin  # (T, heads + KVH, D)
            a = attention(qk[:, :heads], qk[:, heads:], qkv[:, heads + kv:], keys[index], values[index])
            h = h + layer.o(a.reshape(t, heads * dim))
            gate, up = layer.gate_up(_norm(h, layer.norms[1])).chunk(2, -1)
            h = h + layer.down(F.silu(gate) * up)
            hidden.append(h)
        return h, hidden

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: LeanKV, positions: torch.Tensor, mask: torch.Tensor | None,
                taps: tuple[int, ...], last_only: bool, compiled=None) -> Step:
        """ids, positions (T,); ``mask`` additive or boolean (1, 1, T, past + T) or None (causal) -> logits (T, V)
        or (1, V) fp32 and the taps (T, L, H), as ``Target.forward``. ``compiled(h, cos, sin, keys, values,
        attention)``, if given, runs the layers of every forward but the prefill in place of ``layers_pass``."""
        past, t = cache.length, ids.numel()
        cache.reserve(-(-(past + t) // BUCKET) * BUCKET)
        h = self.embed(ids)                                                     # (T, H)
        cos, sin = _rotary(*(x[0] for x in self.rotary(h, positions[None])))   # (T, 1, D)
        prefill = not (past or mask is not None or t == 1)  # causal over an empty cache (AR and speculation share it)
        groups = visible = None
        if not prefill and row_attention_available(h.dtype):  # the C kernel: each row its visible keys (None: causal)
            visible = None if mask is None else visible_keys(mask, t, past + t, ids.device)
        elif not prefill:
            groups = Plan(visible_keys(mask, t, past + t, ids.device)).groups
        contiguous = mask is None and t == 1  # an AR step: its keys are the cache's first rows, read in place
        attention = functools.partial(self._attention, past=past, groups=groups, contiguous=contiguous,
                                      visible=visible, prefill=prefill)
        layers = self.layers_pass if compiled is None or prefill else compiled
        h, hidden = layers(h, cos, sin, cache.keys, cache.values, attention)
        kept = {index: hidden[index] for index in taps}
        cache.length = past + t
        if len(self.layers) - 1 in taps:  # transformers reports the last layer's output after the final norm
            kept[len(self.layers) - 1] = h = _norm(h, self.final_norm)
            h = h[-1:] if last_only else h
        else:
            h = _norm(h[-1:] if last_only else h, self.final_norm)
        tapped = torch.stack([kept[l] for l in taps], 1) if taps else None
        return Step(self.lm_head(h).float(), tapped)


@dataclass
class LeanTarget(Target):
    """A ``Target`` whose forwards run ``LeanDecoder`` over a ``LeanKV`` cache (see the module docstring)."""
    decoder: LeanDecoder | None = field(default=None, repr=False)
    compiled_layers = None  # a subclass's compiled stand-in for LeanDecoder.layers_pass (jetflow.engine.lean_compiled)

    def new_cache(self) -> LeanKV:
        return self.decoder.new_cache()

    def forward(self, ids: torch.Tensor, cache: LeanKV, *, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, taps: tuple[int, ...] = (), last_only: bool = False) -> Step:
        """As ``Target.forward``; ``cache`` must come from this target's ``new_cache()``."""
        if not isinstance(cache, LeanKV):
            raise ValueError("a lean target runs on its own cache: use target.new_cache()")
        past = cache.get_seq_length()
        if positions is None:
            positions = torch.arange(past, past + ids.numel())
        return self.decoder.forward(ids.to(self.device), cache, positions.to(self.device), mask, tuple(taps),
                                    last_only, compiled=self.compiled_layers)


def lean_target(target: Target) -> LeanTarget:
    """``target`` decoding through the lean forward (same model and weights; raises where ``unsupported``)."""
    if isinstance(target, LeanTarget):
        return target
    if type(target) is not Target:
        raise ValueError(f"the lean forward wraps an eager Target, got {type(target).__name__}")
    return LeanTarget(target.model, target.tokenizer, target.name, dict(target.chat_kwargs),
                      decoder=LeanDecoder(target.model))
