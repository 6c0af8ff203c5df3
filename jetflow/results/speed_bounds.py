"""What bounds the compiled target on a CPU: part of the speed run (``jetflow.results.speed``, rows of
``data/results/cpu-compiled``).

- ``profile_rows``: where one verify forward's time goes, eager and compiled, per query size: the
  lm_head (any op with a vocabulary-sized operand), the layers' linears, attention (SDPA, softmax,
  batched matmuls) and everything else (norms, RoPE, inductor's fused kernels, cache writes, Python),
  from ``torch.profiler``'s self times.
- ``probe_rows``: the verify-cost curve again under one change each (``PROBES``): bf16 eager and
  compiled (this kind of CPU computes bf16 natively), a longer static cache (attention spans all of
  it), freezing off. Each probe compiles its own graphs (their seconds are rows too) and drops them
  (``torch._dynamo.reset``) before the next.
"""
from __future__ import annotations

import gc

import torch

from jetflow.evaluation.budget import random_tree, time_verify_step
from jetflow.engine.compiled import QUERY_SIZES, CompileConfig, compile_target
from jetflow.engine.target import Target
from jetflow.engine.load import load_target

LINEARS = ("aten::mm", "aten::addmm", "aten::linear", "mkl::_mkl_linear", "mkldnn::_linear_pointwise",
           "onednn::qlinear_pointwise", "aten::matmul")
ATTENTION = ("attention", "softmax", "bmm")
# name -> (changes to the run's settings, verify sizes); every probe measures its compiled path, the
# dtype probe its eager path too (the run's own eager rows are the fp32 reference)
PROBES = {"bf16": ({"dtype": "bfloat16"}, None),
          "cache-1024": ({"cache_len": 1024}, (1, 17)),
          "no-freezing": ({"freezing": False}, (1, 17))}


def _part(name: str, shapes, vocab: int) -> str | None:
    if any(vocab in s for s in shapes if isinstance(s, (list, tuple))):
        return "lm_head"
    if name in LINEARS:
        return "linears"
    if any(k in name.lower() for k in ATTENTION):
        return "attention"
    return None


def profile_rows(paths: dict[str, Target], sizes: tuple[int, ...], past_len: int, calls: int = 5) -> list[dict]:
    """ms per verify forward of each size, split into lm_head / linears / attention / other."""
    from torch.profiler import ProfilerActivity, profile
    rows = []
    for name, target in paths.items():
        vocab, gen = target.config.vocab_size, torch.Generator().manual_seed(0)
        cache = target.new_cache()
        target.forward(torch.randint(vocab, (past_len,), generator=gen), cache)
        for k in sizes:
            tree = random_tree(k, vocab, gen)
            time_verify_step(target, cache, tree, past_len)  # the first call pays one-off costs
            with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                total = sum(time_verify_step(target, cache, tree, past_len) for _ in range(calls))
            parts = {"lm_head": 0.0, "linears": 0.0, "attention": 0.0}
            for ev in prof.key_averages(group_by_input_shape=True):
                part = _part(ev.key, ev.input_shapes or [], vocab)
                if part is not None:
                    parts[part] += ev.self_cpu_time_total / 1e3  # us -> ms
            ms = {p: v / calls for p, v in parts.items()}
            rows.append({"kind": "profile", "path": name, "size": k, "total_ms": 1e3 * total / calls, **ms,
                         "other": 1e3 * total / calls - sum(ms.values())})
    return rows


def probe_rows(eager: Target, cfg, names: tuple[str, ...], verify_rows, tick=lambda: None) -> list[dict]:
    """The verify-cost curve under each probe of ``PROBES`` (``verify_rows`` is ``speed.verify_rows``)."""
    rows = []
    for name in names:
        change, sizes = PROBES[name]
        torch._dynamo.reset()  # drop the graphs compiled before (each holds its own frozen weights)
        gc.collect()
        dtype, cache_len = change.get("dtype", cfg.dtype), change.get("cache_len", cfg.cache_len)
        base = eager if dtype == cfg.dtype else load_target(None, dtype=dtype)
        compiled = compile_target(base, CompileConfig(cache_len, tuple(s for s in QUERY_SIZES if s <= cache_len),
                                                      freezing=change.get("freezing", True), compile_head=False))
        sizes = sizes or cfg.verify_sizes
        seconds = compiled.warmup(sizes)
        rows += [{"kind": "compile", "graph": f"probe:{name}", "size": k, "seconds": s} for k, s in seconds.items()]
        paths = {"compiled": compiled} if base is eager else {"eager": base, "compiled": compiled}
        sub = type(cfg)(**{**cfg.__dict__, "verify_sizes": sizes})
        rows += [{**r, "kind": "probe", "probe": name, "dtype": dtype, "cache_len": cache_len,
                  "freezing": change.get("freezing", True)} for r in verify_rows(paths, sub)]
        del compiled, base, paths
        tick()
    return rows
