"""A compiled target: ``torch.compile`` over one static KV cache, one graph per query length.

On a CPU the verify pass of a few dozen tokens costs ~2 eager AR steps, much of it kernel overhead
and unpacked weights rather than bytes. Inductor with ``freezing`` (weights constant-folded and
prepacked for oneDNN) over transformers' ``StaticCache`` removes most of that; on CUDA the same
graphs run as CUDA graphs (``mode="reduce-overhead"``).

    target = load_target(None, compile=True)   # a CompiledTarget; same seam as Target
    seconds = target.warmup()                  # {query size: first-call seconds (compile or cache hit)}
    generate(target, prompt, proposer, budget=16)

Shapes never change, so graphs never recompile: the cache always holds ``cache_len`` rows (rows past
the live length are stale and masked), every query is padded up to the next of ``query_sizes``
with masked pad nodes (a budget-16 tree is 17 tokens: exactly the 17 graph, AR is the 1 graph), and
the mask always spans the whole cache, (1, 1, P, cache_len). Prefill (a forward on an empty cache)
runs eager. Compaction (``StaticKV.keep_path``) moves the accepted rows like ``target.keep_path``
does on a dynamic cache and sets the live length; nothing is reallocated.

The compiled target owns ONE static cache: ``new_cache()`` resets it and returns a fresh handle,
and an older handle then refuses to run, so two decodes can never interleave on it silently.
Inductor's FX-graph and AOT caches (``use_disk_cache``: ``$TORCHINDUCTOR_CACHE_DIR``, else ~/.cache/jetflow/inductor)
make a later process's compile a cache load (dynamo still traces), where nothing is frozen (``freezing``).

A proposer's draft pass compiles too (``CompileConfig.compile_head``): ``generate`` on a compiled target
hands its proposer to ``CompiledTarget.draft_proposer``, which asks the proposer for its compiled twin through
a duck hook, ``proposer.compiled_for(target)`` (the twin, or None); the engine knows no proposer class. A head
proposer's twin (``jetflow.drafting.compiled_draft``) runs the head's block and its draft log-probs as one
frozen graph per context bucket (``head_contexts``), with ``call_frozen`` and ``timed_first_call`` below.
"""
from __future__ import annotations

import bisect
import functools
import os
import time
from dataclasses import dataclass, field

import torch
from transformers import StaticCache

from jetflow.util.paths import cache_dir
from .target import Step, Target, cache_argument, move_rows

QUERY_SIZES = (1, 9, 17, 33, 65, 129, 257)  # AR, then budget + 1 for budgets 8, 16, 32, ...
CACHE_MULTIPLE = 256  # a run-sized static cache is rounded up to a multiple of this many rows


@dataclass(frozen=True)
class CompileConfig:
    cache_len: int = 1024                       # static KV rows: prompt + new tokens + budget + 1 must fit
    query_sizes: tuple[int, ...] = QUERY_SIZES  # one graph per size, compiled on first use
    freezing: bool = False                      # CPU: fold and prepack the weights (oneDNN); on, no disk cache
    compile_head: bool = True                   # also compile a proposer's draft pass (its compiled_for twin)
    head_contexts: tuple[int, ...] | None = None  # head context buckets; None: 64, 128, ... up to cache_len

    def __post_init__(self):
        if self.cache_len < 2:
            raise ValueError(f"cache_len must be >= 2, got {self.cache_len}")
        if not self.query_sizes or list(self.query_sizes) != sorted(set(self.query_sizes)) \
                or self.query_sizes[0] != 1:
            raise ValueError(f"query_sizes must be increasing, distinct and start at 1, got {self.query_sizes}")
        if self.query_sizes[-1] > self.cache_len:
            raise ValueError(f"the largest query size ({self.query_sizes[-1]}) exceeds cache_len ({self.cache_len})")
        if self.head_contexts is None:  # every head context fits: it never outgrows the target's cache
            doubling = tuple(2 ** i for i in range(6, self.cache_len.bit_length()) if 2 ** i < self.cache_len)
            object.__setattr__(self, "head_contexts", doubling + (self.cache_len,))
        if not self.head_contexts or list(self.head_contexts) != sorted(set(self.head_contexts)) \
                or self.head_contexts[0] < 1:
            raise ValueError(f"head_contexts must be increasing, distinct and >= 1, got {self.head_contexts}")

    def padded(self, size: int) -> int:
        """The query length a forward of ``size`` tokens runs at: the next of ``query_sizes``."""
        return _bucket(self.query_sizes, size, "a query of {} tokens", "query_sizes")

    def context(self, n_ctx: int) -> int:
        """The context length the head's draft pass runs at for ``n_ctx`` rows: the next of ``head_contexts``."""
        return _bucket(self.head_contexts, n_ctx, "a head context of {} rows", "head_contexts")


def cache_len_for(prompt_len: int, max_new_tokens: int, budget: int = 1,
                  query_sizes: tuple[int, ...] = QUERY_SIZES, multiple: int = CACHE_MULTIPLE) -> int:
    """Static KV rows a run needs: the longest prompt, every new token and one verify of ``budget`` drafts
    plus the root padded to its query size, rounded up to ``multiple`` (never below the largest query size)."""
    if prompt_len < 1 or max_new_tokens < 1 or budget < 1:
        raise ValueError(f"prompt_len, max_new_tokens and budget must be >= 1, got "
                         f"{prompt_len}, {max_new_tokens}, {budget}")
    need = prompt_len + max_new_tokens + _bucket(query_sizes, budget + 1, "a tree of {} tokens", "query_sizes")
    return -(-max(need, query_sizes[-1]) // multiple) * multiple


def run_cache_len(target: Target, prompts, max_new_tokens: int, budget: int = 1) -> int:
    """``cache_len_for`` the longest of ``prompts`` (texts through ``target.encode``, or id sequences)."""
    longest = max((target.encode(p).numel() if isinstance(p, str) else len(p) for p in prompts), default=1)
    return cache_len_for(longest, max_new_tokens, budget)


def warmed_size(compiled, size: int, fallback) -> int:
    """The size a call of ``size`` runs at: the smallest size already compiled that holds it, so a run that warmed
    only its largest tree (or head bucket) pads every smaller one up to it and never compiles mid-run; with none
    compiled that holds it, ``fallback(size)`` (the next configured size)."""
    fits = [s for s in compiled if s >= size]
    return min(fits) if fits else fallback(size)


def _bucket(sizes: tuple[int, ...], size: int, what: str, name: str) -> int:
    i = bisect.bisect_left(sizes, size)
    if i == len(sizes):
        raise ValueError(f"{what.format(size)} exceeds the largest compiled size {sizes[-1]}; "
                         f"add a size to CompileConfig.{name}")
    return sizes[i]


def use_disk_cache() -> str:
    """Inductor's on-disk caches on (the FX graph cache and the AOTAutograd cache), in a folder that lasts:
    ``$TORCHINDUCTOR_CACHE_DIR``, set to ``~/.cache/jetflow/inductor`` (``$JETFLOW_CACHE/inductor``) where unset, so a
    later process loads every graph's compiled code rather than compiling it (dynamo still traces each graph:
    docs/compiled.md). Returns the folder."""
    import torch._functorch.config
    import torch._inductor.config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    # inductor writes its own default (under /tmp) into the variable the first time anything asks for its folder
    # (loading a quantized target does), so that value counts as unset
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "inductor")
    torch._inductor.config.fx_graph_cache = True
    torch._functorch.config.enable_autograd_cache = True
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def call_frozen(graph, freezing: bool, device: torch.device, *args):
    """Call a compiled graph; freezing is read while compiling, from the global inductor config
    (torch.compile's options= does not reach it), so it is patched around the call only."""
    import torch._inductor.config  # the freezing switch; torch._inductor takes seconds to import, so only here
    with torch._inductor.config.patch(freezing=freezing and device.type == "cpu"):
        return graph(*args)


def timed_first_call(compile_s: dict, key: int, device: torch.device, call):
    """Run ``call()``; the first call per ``key`` (compile or cache load) is timed into ``compile_s``."""
    first = key not in compile_s
    t0 = time.perf_counter()
    out = call()
    if first:
        if device.type == "cuda":
            torch.cuda.synchronize()
        compile_s[key] = time.perf_counter() - t0
    return out


def padded_mask(mask: torch.Tensor | None, past_len: int, size: int, padded: int, cache_len: int,
                dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> torch.Tensor:
    """(1, 1, P, cache_len) additive mask over the whole static cache for ``size`` real query rows, built on
    ``device`` (default: the tree mask's, else the CPU).

    Real rows keep ``mask`` (1, 1, size, past + size) on the live columns, or plain causal
    attention when it is None; every other column (pad nodes, stale rows) is masked. Pad row i
    sees only its own slot, so no softmax row is empty and no real row ever sees a pad."""
    if padded < size or past_len + padded > cache_len:
        raise ValueError(f"cannot pad {size} query rows to {padded} after {past_len} cached rows "
                         f"in a cache of {cache_len}")
    low = torch.finfo(dtype).min
    device = (mask.device if mask is not None else "cpu") if device is None else device
    full = torch.full((padded, cache_len), low, dtype=dtype, device=device)  # (P, cache_len)
    if mask is None:
        full[:size, :past_len] = 0
        full[:size, past_len:past_len + size] = torch.full((size, size), low, dtype=dtype, device=device).triu(1)
    else:
        if mask.shape[-2:] != (size, past_len + size):
            raise ValueError(f"mask must be (1, 1, {size}, {past_len + size}), got {tuple(mask.shape)}")
        full[:size, :past_len + size] = mask.reshape(size, past_len + size).to(device=device, dtype=dtype)
    pads = torch.arange(size, padded, device=device)
    full[pads, past_len + pads] = 0
    return full[None, None]


class StaticKV:
    """A handle on the compiled target's static cache: its live length and compaction."""

    def __init__(self, engine: "StaticEngine", epoch: int):
        self.engine, self.epoch, self.length = engine, epoch, 0

    def get_seq_length(self) -> int:
        return self.length

    def keep_path(self, past_len: int, path: list[int]) -> None:
        """Keep the first ``past_len`` rows plus the tree rows ``path`` (after the prefix, in order);
        the same rows as ``target.keep_path`` keeps on a dynamic cache."""
        self.engine.check(self)
        n = len(path)
        if path != list(range(n)):
            for layer in self.engine.cache.layers:
                move_rows(layer.keys, past_len, path)
                move_rows(layer.values, past_len, path)
        self.length = past_len + n


def _run(model, cache_arg: str, cache, ids, positions, mask, keep: int = 0):
    """ids, positions (1, P), mask (1, 1, P, cache_len) -> (logits (P, V), or (keep, V) of the last ``keep``
    positions, hidden (layers + 1, P, H))."""
    out = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                output_hidden_states=True, logits_to_keep=keep, **{cache_arg: cache})
    return out.logits[0], torch.stack(out.hidden_states)[:, 0]


class StaticEngine:
    """The static cache and the compiled graphs of one model (shared by every copy of its target)."""

    def __init__(self, model: torch.nn.Module, config: CompileConfig):
        self.model, self.config = model, config
        self.device = model.get_input_embeddings().weight.device
        self.dtype = model.get_input_embeddings().weight.dtype
        self.cache = StaticCache(config=model.config, max_cache_len=config.cache_len)
        self.epoch = 0
        self.graphs: dict[int, object] = {}
        self.compile_s: dict[int, float] = {}  # query size -> seconds of its first call (compile or cache load)
        self._eager = functools.partial(_run, model, cache_argument(type(model)), self.cache)
        self.drafts: dict[int, object] = {}     # id(head) -> its compiled draft pass (kept by the proposers' twins)
        self.proposers: dict[int, tuple] = {}   # id(proposer) -> (proposer, its compiled twin)
        use_disk_cache()
        # one code object (_run) holds every size's graph; never let dynamo fall back to eager silently
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)

    def new_handle(self) -> StaticKV:
        self.epoch += 1
        return StaticKV(self, self.epoch)

    def check(self, handle) -> None:
        if not isinstance(handle, StaticKV) or handle.engine is not self:
            raise ValueError("a compiled target runs only on its own cache: use target.new_cache()")
        if handle.epoch != self.epoch:
            raise ValueError("this cache was replaced by a later target.new_cache() (the compiled target "
                             "holds one static cache); decode one sequence at a time")

    def _graph(self, size: int):
        if size not in self.graphs:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self.graphs[size] = torch.compile(self._eager, dynamic=False, mode=mode)
        return self.graphs[size]

    def run(self, handle: StaticKV, ids: torch.Tensor, positions: torch.Tensor,
            mask: torch.Tensor | None, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """ids, positions (T,) after the live rows -> (logits (T, V), hidden (layers + 1, T, H)); ``last_only``
        on a prefill (eager): logits (1, V) of the last position."""
        self.check(handle)
        past, size = handle.length, ids.numel()
        # prefill runs eager at its own length; a decode forward at the next compiled size, else the next configured one
        padded = size if past == 0 else warmed_size(self.compile_s, size, self.config.padded)
        full = padded_mask(mask, past, size, padded, self.config.cache_len, self.dtype, self.device)
        ids = torch.cat([ids, ids.new_zeros(padded - size)])[None].to(self.device)  # (1, P)
        positions = torch.cat([positions, positions.new_full((padded - size,), past)])[None].to(self.device)
        for layer in self.cache.layers:  # writes land at rows past .. past + P
            if layer.is_initialized:
                layer.cumulative_length.fill_(past)
        if past == 0:
            logits, hidden = self._eager(ids, positions, full, keep=int(last_only))
        else:
            logits, hidden = timed_first_call(self.compile_s, padded, self.device, lambda: call_frozen(
                self._graph(padded), self.config.freezing, self.device, ids, positions, full))
        handle.length = past + size
        if self.device.type == "cuda":  # CUDA-graph outputs are overwritten by the next replay
            logits, hidden = logits.clone(), hidden.clone()
        return logits[:size], hidden[:, :size]


@dataclass
class CompiledTarget(Target):
    """A ``Target`` whose decode forwards run compiled over a static cache (see the module docstring)."""
    engine: StaticEngine | None = field(default=None, repr=False)

    @property
    def max_context(self) -> int:
        return min(super().max_context, self.engine.config.cache_len)

    @property
    def context_limit(self) -> str:
        rows = self.engine.config.cache_len
        if rows >= super().max_context:
            return super().context_limit
        return (f"the compiled target's static cache of {rows} rows (size it from the run: "
                f"load_target(..., cache_len=cache_len_for(...)) or --cache-len)")

    def new_cache(self) -> StaticKV:
        return self.engine.new_handle()

    def draft_proposer(self, proposer):
        """``proposer`` with its draft pass compiled (``generate`` calls this): its twin from the duck hook
        ``proposer.compiled_for(self)``, built once per proposer; a proposer without the hook, or whose hook
        gives None, comes back as it is, as everything does when ``compile_head`` is off."""
        hook = getattr(proposer, "compiled_for", None)
        if not self.engine.config.compile_head or hook is None:
            return proposer
        twins = self.engine.proposers
        if id(proposer) not in twins:
            twin = hook(self)
            if twin is None:
                return proposer
            twins[id(proposer)] = (proposer, twin)  # the original kept alive: ids stay unique
        return twins[id(proposer)][1]

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, cache: StaticKV, *, positions: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, taps: tuple[int, ...] = (), last_only: bool = False) -> Step:
        """As ``Target.forward``; ``cache`` must come from this target's ``new_cache()``."""
        past = cache.get_seq_length()
        if positions is None:
            positions = torch.arange(past, past + ids.numel())
        logits, hidden = self.engine.run(cache, ids.cpu(), positions.cpu(), mask, last_only and past == 0)
        if last_only:
            logits = logits[-1:]
        tapped = hidden[[l + 1 for l in taps]].transpose(0, 1) if taps else None  # (T, L, H)
        return Step(logits.float(), tapped)

    @torch.no_grad()
    def warmup(self, sizes: tuple[int, ...] | None = None, past_len: int = 8) -> dict[int, float]:
        """Compile (or load from inductor's cache) the graph of every query size (default: all of
        ``query_sizes``) on a throwaway prefix; returns {size: seconds of its first call}."""
        sizes = self.engine.config.query_sizes if sizes is None else tuple(sizes)
        for size in sizes:
            if size not in self.engine.compile_s:
                cache = self.new_cache()
                self.forward(torch.zeros(past_len, dtype=torch.long), cache)
                self.forward(torch.zeros(size, dtype=torch.long), cache)
        return {s: self.engine.compile_s[s] for s in sizes}

    def warm(self, proposers=(), *, rows: int | None = None, tree=None, shortest: int = 1) -> list[dict]:
        """Compile (or load) every graph a run can reach, before any timing: the AR graph and the one a
        ``tree``-token verify pads to (``tree``: a size or several; smaller trees pad up to the next of them,
        ``warmed_size``; default: every query size)
        and, for each proposer whose compiled twin has a ``warmup`` hook, its draft pass's context bucket of
        ``rows`` context rows (smaller contexts pad up to it; default: every bucket from ``shortest``'s).
        Returns one row per graph compiled or loaded by this call ({"graph", "size", "seconds"})."""
        cfg = self.engine.config
        before = self.compiled_graphs()
        trees = () if tree is None else (tree,) if isinstance(tree, int) else tuple(tree)
        self.warmup(cfg.query_sizes if tree is None else tuple(sorted({1, *map(cfg.padded, trees)})))
        for proposer in proposers:
            hook = getattr(self.draft_proposer(proposer), "warmup", None)
            if hook is not None:
                hook(None if rows is None else min(rows, cfg.cache_len), shortest)
        seconds = {("target", s): t for s, t in self.engine.compile_s.items()}
        seconds.update({("draft", h, s): t for h, d in self.engine.drafts.items() for s, t in d.compile_s.items()})
        return [{"graph": key[0], "size": key[-1], "seconds": seconds[key]}
                for key in sorted(self.compiled_graphs() - before, key=lambda k: (k[0], k[-1]))]

    def compiled_graphs(self) -> set[tuple]:
        """Every graph compiled or loaded so far: ("target", query size) and ("draft", id(head), bucket)."""
        drafts = {("draft", h, s) for h, d in self.engine.drafts.items() for s in d.compile_s}
        return {("target", s) for s in self.engine.compile_s} | drafts


def compile_target(target: Target, config: CompileConfig = CompileConfig()) -> CompiledTarget:
    """The compiled counterpart of ``target`` (same model and weights; graphs compile on first use)."""
    if isinstance(target, CompiledTarget):
        raise ValueError("target is compiled already")
    return CompiledTarget(target.model, target.tokenizer, target.name, dict(target.chat_kwargs),
                          engine=StaticEngine(target.model, config))
