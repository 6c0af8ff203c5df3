"""Eager against compiled on this machine, beside llama.cpp: the rows of ``data/results/cpu-compiled``.

    python -m jetflow results cpu-compiled    # = python -m jetflow speed --out data/results/cpu-compiled (~10 min on an idle machine)

One process measures, interleaved so that a shared machine's load hits every path alike (medians
over repeats): the compile seconds of every graph (the target's query sizes and each head's draft
pass); the verify-cost curve (1, 9, 17, 33, 65 tokens, ``budget.measure_verify_cost``) eager and
compiled; the head's draft pass (block + draft log-probs) eager and compiled over the same context;
AR and the head methods' decode tokens/s on a few GSM8K prompts eager and compiled (the compiled path
drafts with the compiled head pass), with the draft and verify milliseconds per round; llama.cpp's AR
on the same GGUF file with the same thread count (``pip install -e ".[bench]"``; skipped with a note
when absent). Then exactness: every method's compiled greedy output against compiled AR, and compiled
AR against eager AR, with the target's top-2 logit gap where the two first differ.

``--warmup`` only compiles the same graphs (filling inductor's cache for a later timed run) and writes nothing.
The run's table.md is ``jetflow.results.speed_table``.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers
from tqdm.auto import tqdm

from jetflow.util import hardware
from jetflow.data import prompts as data
from jetflow.evaluation.rows import write_rows
from jetflow.evaluation.budget import measure_verify_cost
from jetflow.engine.compiled import QUERY_SIZES, CompileConfig, compile_target
from jetflow.engine.decode import generate
from jetflow.drafting import methods as registry
from jetflow.drafting.proposers import LookupMerged
from jetflow.drafting.methods import make_proposer
from . import llamacpp
from .speed_bounds import PROBES, probe_rows, profile_rows
from .speed_table import to_markdown
from jetflow.engine.target import Target
from jetflow.engine.load import embedded_gguf, load_target

@dataclass(frozen=True)
class SpeedConfig:
    dtype: str = "float32"                         # the target's dtype, eager and compiled alike
    threads: int = 2                               # torch's and llama.cpp's
    dataset: str = "gsm8k"
    limit: int = 3                                 # prompts (the first ones of the dataset)
    max_new_tokens: int = 64
    budget: int = 16
    methods: tuple[str, ...] = ("jetflow+lookup", "jetflow")  # timed beside AR
    verify_sizes: tuple[int, ...] = (1, 9, 17, 33, 65)
    verify_repeats: int = 3                        # interleaved sweeps of the curve
    draft_repeats: int = 20                        # interleaved timings of the head's draft pass
    past_len: int = 256                            # cached prefix under the verify curve
    repeats: int = 2                               # timed decodes of every prompt and configuration
    cache_len: int = 512                           # the compiled target's static cache (attention spans it all)
    llama_cpp: bool = True
    exact_methods: tuple[str, ...] = registry.names(lambda m: m.decodes and m.name != "ar")  # vs compiled AR
    profile_sizes: tuple[int, ...] = (1, 17)       # verify forwards split into lm_head / linears / attention / other
    probes: tuple[str, ...] = tuple(PROBES)        # the verify curve again under one change each (speed_bounds)

    def __post_init__(self):
        if self.threads < 1 or self.limit < 1 or self.repeats < 1 or self.verify_repeats < 1:
            raise ValueError("threads, limit, repeats and verify_repeats must be >= 1")
        if 1 not in self.verify_sizes:
            raise ValueError("verify_sizes must include 1 (the AR step every cost is relative to)")
        decoding = registry.names(lambda m: m.decodes and m.name != "ar")
        unknown = [m for m in (*self.methods, *self.exact_methods) if m not in decoding]
        if unknown:
            raise ValueError(f"unknown or AR methods {unknown}; AR is always measured")
        if set(self.probes) - set(PROBES):
            raise ValueError(f"unknown probes {sorted(set(self.probes) - set(PROBES))}; choose from {', '.join(PROBES)}")


# ----------------------------------------------------------------------------- llama.cpp
def llama_cpp_model(threads: int, n_ctx: int):
    """llama.cpp over the embedded target's GGUF file (the optional ``bench`` extra; ``llamacpp.load``)."""
    return llamacpp.load(threads, n_ctx)


def llama_cpp_ar(llm, ids: list[int], max_new_tokens: int, eos: set[int]) -> tuple[list[int], int, float]:
    """Greedy AR: (tokens, tokens timed, decode seconds); as in ``generate``, the first token comes
    from the prefill and the timed decode starts after it."""
    llm.reset()  # no reuse of an earlier prompt's cache
    out, t_first = [], 0.0
    for tok in llm.generate(ids, temp=0.0, top_k=1, reset=True):
        out.append(int(tok))
        if len(out) == 1:
            t_first = time.perf_counter()
        if len(out) >= max_new_tokens or tok in eos:
            break
    return out, len(out) - 1, time.perf_counter() - t_first


# ----------------------------------------------------------------------------- measurements
def _nothing() -> None:
    pass


def verify_rows(paths: dict[str, Target], cfg: SpeedConfig, tick=_nothing) -> list[dict]:
    """Median seconds per verify size for every path, sweeps interleaved across paths."""
    times = {name: {k: [] for k in cfg.verify_sizes} for name in paths}
    for rep in range(cfg.verify_repeats):
        for name, target in paths.items():
            cost = measure_verify_cost(target, cfg.verify_sizes, past_len=cfg.past_len, repeats=1, seed=rep)
            for k, s in cost.items():
                times[name][k].append(s)
        tick()
    rows = []
    for name, by_size in times.items():
        ar = statistics.median(by_size[1])
        rows += [{"kind": "verify", "path": name, "size": k, "seconds": statistics.median(t),
                  "ar_steps": statistics.median(t) / ar} for k, t in by_size.items()]
    return rows


def _decode(target, ids, proposer, cfg) -> tuple:
    """(tokens, decode tokens, decode seconds, tau, draft seconds, rounds) of one greedy decode."""
    res = generate(target, ids, proposer, budget=cfg.budget, max_new_tokens=cfg.max_new_tokens)
    return res.tokens, sum(len(r.committed) for r in res.rounds), res.decode_s, res.tau, res.draft_s, len(res.rounds)


def decode_runs(paths: dict[str, Target], prompts: list[torch.Tensor], cfg: SpeedConfig, llm=None,
                proposers: dict | None = None, tick=_nothing) -> dict:
    """(path, method) -> one list per repeat of ``_decode``'s tuple per prompt; every configuration of
    a prompt runs before the next prompt, repeats outermost. Both paths share one proposer per method
    (``proposers``, default: made here); the compiled target drafts through its compiled head pass."""
    made = {"ar": None, **(proposers or {m: make_proposer(m, paths["eager"]) for m in cfg.methods})}
    props = {(p, m): made[m] for p in paths for m in made}
    runs = {key: [[] for _ in range(cfg.repeats)] for key in props}
    if llm is not None:
        runs[("llama.cpp", "ar")] = [[] for _ in range(cfg.repeats)]
    eos = next(iter(paths.values())).eos_ids
    for rep in range(cfg.repeats):
        for ids in prompts:
            for (path, method), proposer in props.items():
                runs[(path, method)][rep].append(_decode(paths[path], ids, proposer, cfg))
            if llm is not None:
                toks, n, secs = llama_cpp_ar(llm, ids.tolist(), cfg.max_new_tokens, eos)
                runs[("llama.cpp", "ar")][rep].append((toks, n, secs, 1.0, 0.0, n))
            tick()
    return runs


def _rate(rep_runs) -> float:
    return sum(r[1] for r in rep_runs) / sum(r[2] for r in rep_runs)


def _ms_per_round(rep_runs, draft: bool) -> float:
    """Milliseconds per round of drafting (``draft``) or of the rest (verify, accept, commit)."""
    secs = sum(r[4] if draft else r[2] - r[4] for r in rep_runs)
    return 1e3 * secs / sum(r[5] for r in rep_runs)


def decode_rows(runs: dict, cfg: SpeedConfig) -> list[dict]:
    """One row per (path, method): median over repeats of tokens/s (totals over prompts) and of the
    ratios to the same path's AR and to eager AR, both within the same repeat; ``identical_to_ar``
    counts prompts whose tokens equal the same path's AR (eager AR for the AR rows)."""
    rows = []
    for (path, method), reps in runs.items():
        rates = [_rate(r) for r in reps]
        own_ar = runs[(path, "ar")]
        ref = runs[("eager", "ar")] if method == "ar" else None  # AR rows: against eager AR
        rows.append({
            "kind": "decode", "path": path, "method": method, "budget": None if method == "ar" else cfg.budget,
            "tokens_per_s": statistics.median(rates),
            "speedup": statistics.median(r / _rate(a) for r, a in zip(rates, own_ar)),
            "vs_eager_ar": statistics.median(r / _rate(a) for r, a in zip(rates, runs[("eager", "ar")])),
            "draft_ms": statistics.median(_ms_per_round(r, True) for r in reps),
            "verify_ms": statistics.median(_ms_per_round(r, False) for r in reps),
            "tau": statistics.mean(r[3] for r in reps[0]), "new_tokens": sum(len(r[0]) for r in reps[0]),
            "identical_to_ar": sum(a[0] == b[0] for a, b in zip(reps[0], (ref or own_ar)[0]))})
    return rows


def head_of(proposer):
    """The ``HeadProposer`` inside a head method's proposer (None for training-free methods)."""
    inner = proposer.inner if isinstance(proposer, LookupMerged) else proposer
    return inner if hasattr(inner, "depth_logp") else None


def warm_drafts(compiled, proposers: dict, state) -> list[dict]:
    """Compile (or load) every head's draft pass over ``state``: compile rows named draft:<method>."""
    rows = []
    for method, proposer in proposers.items():
        inner = head_of(proposer)
        if inner is not None:
            draft = compiled.draft_proposer(inner).draft
            if not draft.compile_s:
                draft(state(inner), 0, inner.embed)
                rows.append({"kind": "compile", "graph": f"draft:{method}", "size": None,
                             "seconds": next(iter(draft.compile_s.values()))})
    return rows


def draft_rows(compiled, proposers: dict, state, cfg: SpeedConfig) -> list[dict]:
    """The head's draft pass (block pass + draft log-probs, after extend) eager and compiled over the
    same context, timings interleaved; with the largest log-prob difference and the depths whose argmax
    differs."""
    rows = []
    for method, proposer in proposers.items():
        inner = head_of(proposer)
        if inner is None:
            continue
        st, draft = state(inner), compiled.draft_proposer(inner).draft
        run = {"eager": lambda: inner.logp(inner.head.draft_block(st, 0, inner.embed)),
               "compiled": lambda: draft(st, 0, inner.embed)[1]}
        times = {k: [] for k in run}
        for _ in range(cfg.draft_repeats):
            for k, f in run.items():
                t0 = time.perf_counter()
                out = f()
                times[k].append(time.perf_counter() - t0)
        want, got = run["eager"](), run["compiled"]()
        for k, t in times.items():
            rows.append({"kind": "draft", "method": method, "path": k, "context": st.n_ctx,
                         "dtype": str(inner.head.dtype).removeprefix("torch."), "seconds": statistics.median(t),
                         "max_abs_diff": float((got - want).abs().max()),
                         "argmax_differs": int((got.argmax(-1) != want.argmax(-1)).sum())})
    return rows


def _context_state(eager: Target, cfg: SpeedConfig):
    """head proposer -> its HeadState over ``cfg.past_len`` random committed tokens (the verify curve's prefix)."""
    ids = torch.randint(eager.config.vocab_size, (cfg.past_len,), generator=torch.Generator().manual_seed(0))
    states = {}

    def state(inner):
        if inner.taps not in states:
            states[inner.taps] = eager.forward(ids, eager.new_cache(), taps=inner.taps).taps
        return inner.head.extend(None, states[inner.taps].to(inner.head.dtype))
    return state


def top2_gap(target: Target, ids: list[int]) -> float:
    """The target's (eager, full-sequence) top-1 minus top-2 logit after ``ids``."""
    logits = target.model(torch.tensor([ids])).logits[0, -1].float()
    top = logits.topk(2).values
    return float(top[0] - top[1])


def agreement_rows(eager: Target, prompts, ar_eager: list, ar_compiled: list, ids_of) -> list[dict]:
    """Compiled AR against eager AR per prompt: the first differing token and the top-2 gap there."""
    rows = []
    for pid, ids, a, b in zip(ids_of, prompts, ar_eager, ar_compiled):
        first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if first is None and len(a) != len(b):
            first = min(len(a), len(b))
        gap = None if first is None else top2_gap(eager, ids.tolist() + a[:first])
        rows.append({"kind": "ar-agreement", "prompt": pid, "new_tokens": len(a), "first_difference": first,
                     "top2_gap_there": gap})
    return rows


def exactness_rows(compiled: Target, prompts, ar_compiled: list, cfg: SpeedConfig, tick=_nothing) -> list[dict]:
    """Every method's compiled greedy output against compiled AR, prompt by prompt."""
    rows = []
    for method in cfg.exact_methods:
        proposer = make_proposer(method, compiled)
        same = [_decode(compiled, ids, proposer, cfg)[0] == ref for ids, ref in zip(prompts, ar_compiled)]
        rows.append({"kind": "exactness", "method": method, "budget": cfg.budget,
                     "identical_to_compiled_ar": sum(same), "n_prompts": len(same)})
        tick()
    return rows


def _inductor_entries() -> int:
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    root = Path(cache_dir())
    return sum(1 for _ in root.rglob("*")) if root.exists() else 0


@torch.no_grad()
def measure(cfg: SpeedConfig = SpeedConfig(), data_dir=None, eager: Target | None = None,
            warmup: bool = False) -> list[dict]:
    """All rows of one run (see the module docstring); ``eager`` replaces the embedded target (tests);
    ``warmup``: stop after compiling (the setup and compile rows)."""
    torch.set_num_threads(cfg.threads)
    eager = eager or load_target(None, dtype=cfg.dtype)
    # one head context bucket (the whole cache): one draft graph per head
    compile_cfg = CompileConfig(cfg.cache_len, tuple(s for s in QUERY_SIZES if s <= cfg.cache_len),
                                head_contexts=(cfg.cache_len,))
    compiled = compile_target(eager, compile_cfg)
    items = data.load_prompts(cfg.dataset, limit=cfg.limit, data_dir=data_dir)
    prompts = [eager.encode(p["prompt"]) for p in items]
    llm = llama_cpp_model(cfg.threads, cfg.cache_len) if cfg.llama_cpp and not warmup else None
    setup = {"kind": "setup", "hardware": hardware.describe(), "torch": torch.__version__,
             "transformers": transformers.__version__, "gguf": embedded_gguf().name,
             "llama_cpp": llamacpp.version() if llm is not None else None,
             "inductor_cache_files_before": _inductor_entries(), "prompts": [p["id"] for p in items],
             "load_average_before": os.getloadavg()[0],
             "config": asdict(cfg)}
    sizes = tuple(sorted({*cfg.verify_sizes, compile_cfg.padded(cfg.budget + 1)}))
    steps = len(sizes) + 1 + (0 if warmup else cfg.verify_repeats + 1 + cfg.repeats * len(prompts)
                              + len(cfg.exact_methods) + 1 + len(cfg.probes))
    bar = tqdm(total=steps, desc="speed (compile, verify, draft, decode, exactness)", unit="step")
    rows = [setup]
    for k in sizes:  # graph by graph (each compiles or loads from inductor's cache on first use)
        rows.append({"kind": "compile", "graph": "target", "size": k, "seconds": compiled.warmup((k,))[k]})
        bar.update()
    proposers = {m: make_proposer(m, eager) for m in cfg.methods}
    state = _context_state(eager, cfg)
    rows += warm_drafts(compiled, proposers, state)
    bar.update()
    if warmup:
        bar.close()
        return rows
    paths = {"eager": eager, "compiled": compiled}
    rows += verify_rows(paths, cfg, bar.update)
    rows += draft_rows(compiled, proposers, state, cfg)
    bar.update()
    runs = decode_runs(paths, prompts, cfg, llm, proposers, bar.update)
    rows += decode_rows(runs, cfg)
    ar_eager, ar_compiled = ([r[0] for r in runs[(p, "ar")][0]] for p in ("eager", "compiled"))
    rows += agreement_rows(eager, prompts, ar_eager, ar_compiled, setup["prompts"])
    if llm is not None:
        llm.close()
    rows += exactness_rows(compiled, prompts, ar_compiled, cfg, bar.update)
    rows += profile_rows(paths, cfg.profile_sizes, cfg.past_len) if cfg.profile_sizes else []
    bar.update()
    del paths, compiled, proposers
    rows += probe_rows(eager, cfg, cfg.probes, verify_rows, bar.update)
    bar.close()
    setup["load_average_after"] = os.getloadavg()[0]  # 1-minute load: how much else shared the cores
    return rows


def add_arguments(parser) -> None:
    """The flags of ``python -m jetflow speed`` (and ``python -m jetflow.results.speed``)."""
    parser.add_argument("--out", help="folder for rows.json and table.md (required unless --warmup)")
    parser.add_argument("--dtype", default=SpeedConfig.dtype)
    parser.add_argument("--threads", type=int, default=SpeedConfig.threads)
    parser.add_argument("--limit", type=int, default=SpeedConfig.limit)
    parser.add_argument("--max-new-tokens", type=int, default=SpeedConfig.max_new_tokens)
    parser.add_argument("--repeats", type=int, default=SpeedConfig.repeats)
    parser.add_argument("--no-llama-cpp", action="store_true", help="skip llama.cpp (no bench extra)")
    parser.add_argument("--methods", type=_names, default=SpeedConfig.methods, help="head methods timed beside AR (comma list)")
    parser.add_argument("--exact-methods", type=_names, default=SpeedConfig.exact_methods,
                        help='methods checked against compiled AR (comma list; "" for none)')
    parser.add_argument("--probes", type=_names, default=SpeedConfig.probes,
                        help='verify curves under one change each (comma list of speed_bounds.PROBES; "" for none)')
    parser.add_argument("--warmup", action="store_true",
                        help="only compile the same graphs (fills inductor's cache for a timed run); writes nothing")


def _names(text: str) -> tuple[str, ...]:
    return tuple(n for n in text.split(",") if n)


def config_of(args) -> SpeedConfig:
    return SpeedConfig(dtype=args.dtype, threads=args.threads, limit=args.limit, max_new_tokens=args.max_new_tokens,
                       repeats=args.repeats, llama_cpp=not args.no_llama_cpp, methods=args.methods,
                       exact_methods=args.exact_methods, probes=args.probes)


def run_args(args) -> int:
    if args.warmup:
        for r in measure(config_of(args), warmup=True)[1:]:
            print(f"compiled {r['graph']} {r['size'] or ''} in {r['seconds']:.1f} s")
        return 0
    if not args.out:
        print("error: speed: --out is required (or --warmup)", file=sys.stderr)
        return 2  # the CLI's bad-input exit status
    rows = measure(config_of(args))
    print(to_markdown(rows))
    write_rows(rows, args.out, to_markdown)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m jetflow.results.speed", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run_args(parser.parse_args(argv))


if __name__ == "__main__":
    main()
