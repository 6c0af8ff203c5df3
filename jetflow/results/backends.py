"""One run, one table: every backend the kit has (fp32, bf16, int8, q4) beside llama.cpp on the same GGUF.

    python -m jetflow speed --backends fp32,bf16 --dataset math500 --limit 4 --out DIR
    python -m jetflow speed --prompts-file my.jsonl --json        # one JSON row per timed configuration

Every configuration (backend x method, and llama.cpp's AR and prompt-lookup decoding) decodes each
prompt before the next prompt starts, repeats outermost, so a shared machine's load hits them alike.
Methods: AR, prompt lookup and the head methods asked for (``--methods``) at one budget per backend:
``--budget auto`` lets ``evaluation.budget.auto_budget`` pick it from that backend's own verify-cost
curve and a short calibration on the first prompt. ``identical_to_ar`` counts prompts whose greedy
output equals the same backend's AR (llama.cpp's lookup against llama.cpp's AR). Loading and compile
seconds are rows of their own, never inside tokens/s. A copy benchmark (``bandwidth``) gives this
machine's memory bandwidth; with the bytes of weights each backend reads per decoded token it bounds
AR tokens/s from above (docs/speed.md).
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass

import torch

from jetflow.util import hardware
from jetflow.data import prompts as data
from jetflow.engine.compiled import cache_len_for
from jetflow.engine.decode import generate
from jetflow.engine.load import BACKENDS, embedded_gguf
from jetflow.engine.load import load_backend as engine_load_backend
from jetflow.drafting.methods import make_proposer
from jetflow.evaluation.budget import auto_budget
from jetflow.evaluation.rows import write_rows
from .bandwidth import copy_bandwidth
from . import llamacpp
from .llamacpp_verify import SIZES, ar_agreement, route_rows, verify_curve
from .speed import llama_cpp_ar, llama_cpp_model

AUTO_CANDIDATES = (3, 8, 16, 32)  # 3: four rows, one block of the int4 kernel (about 1.4 AR steps)
COMPILED = "-compiled"  # a backend name's suffix: the compiled target (jetflow.engine.compiled)
BANDWIDTH_MIB = (64, 1024)  # a copy that fits the last-level cache of big server CPUs, and one that does not


@dataclass(frozen=True)
class BackendsConfig:
    backends: tuple[str, ...] = ("fp32", "bf16")
    methods: tuple[str, ...] = ("jetflow-pc+lookup",)   # head methods, beside AR and lookup
    budget: int | None = None                           # None: auto_budget per backend
    dataset: str = "math500"
    skip: int = 0
    limit: int = 4
    prompts_file: str | None = None                     # overrides dataset/skip/limit
    max_new_tokens: int = 96
    repeats: int = 1
    threads: int = 2
    llama_cpp: bool = True

    def __post_init__(self):
        unknown = [b for b in self.backends if b not in backend_names()]
        if unknown or not self.backends:
            raise ValueError(f"unknown backends {unknown}; choose from {', '.join(backend_names())}")
        if self.threads < 1 or self.limit < 1 or self.repeats < 1:
            raise ValueError("threads, limit and repeats must be >= 1")


def backend_names() -> tuple[str, ...]:
    """fp32, bf16, int8, q4 and each one compiled (``NAME-compiled``: graphs warmed before any timing)."""
    return (*BACKENDS, *(f"{b}{COMPILED}" for b in BACKENDS))


def load_backend(name: str, cache_len: int | None = None):
    """The embedded target as ``name`` (``engine.load.BACKENDS``); ``NAME-compiled``: its compiled twin over a
    ``cache_len``-row static cache."""
    compiled = name.endswith(COMPILED)
    return engine_load_backend(name.removesuffix(COMPILED), compile=compiled, cache_len=cache_len if compiled else None)


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the model's parameters and buffers, every tensor once (tied weights count once)."""
    seen = {}
    for t in (*model.parameters(), *model.buffers()):
        seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def _prompts(cfg: BackendsConfig, data_dir) -> list[dict]:
    if cfg.prompts_file:
        return data.load_prompts_file(cfg.prompts_file)
    return data.load_prompts(cfg.dataset, limit=cfg.skip + cfg.limit, data_dir=data_dir)[cfg.skip:]


def _cache_len(name: str, prompts: list[dict], cfg: BackendsConfig) -> int | None:
    """A compiled backend's static cache rows: the longest prompt, every new token and the largest tree."""
    if not name.endswith(COMPILED):
        return None
    eager = load_backend(name.removesuffix(COMPILED))
    return cache_len_for(max(len(eager.encode(p["prompt"])) for p in prompts), cfg.max_new_tokens,
                         cfg.budget or max(AUTO_CANDIDATES))


def _warm(target, methods: dict, prompts: list[dict], cfg: BackendsConfig) -> float:
    """Compile (or load from inductor's cache) every graph a compiled backend can reach: its seconds,
    spent before any timing (0 for an eager backend)."""
    if not hasattr(target, "warm"):
        return 0.0
    t0 = time.perf_counter()
    target.warm([p for p in methods.values() if p is not None], tree=(cfg.budget or max(AUTO_CANDIDATES)) + 1,
                shortest=min(len(target.encode(p["prompt"])) for p in prompts))
    return time.perf_counter() - t0


def _setup_backends(cfg: BackendsConfig, prompts: list[dict]) -> tuple[dict, list[dict]]:
    """name -> (target, budget, {method: proposer}); with a load row per backend (load, compile and budget
    pick seconds, all before the clock)."""
    out, rows = {}, []
    for name in cfg.backends:
        t0 = time.perf_counter()
        target = load_backend(name, _cache_len(name, prompts, cfg))
        load_s = time.perf_counter() - t0
        methods = {"ar": None, "lookup": make_proposer("lookup", target),
                   **{m: make_proposer(m, target) for m in cfg.methods}}
        compile_s = _warm(target, methods, prompts, cfg)
        budget, predicted, t0 = cfg.budget, None, time.perf_counter()
        if budget is None and cfg.methods:
            budget, predicted = auto_budget(target, cfg.methods[0], prompts[:1], budgets=AUTO_CANDIDATES,
                                            max_new_tokens=32)
        out[name] = (target, budget or 16, methods)
        rows.append({"kind": "backend", "backend": name, "dtype": str(target.dtype).removeprefix("torch."),
                     "load_s": load_s, "compile_s": compile_s, "budget_pick_s": time.perf_counter() - t0,
                     "auto_budget": budget if cfg.budget is None else None, "predicted_tokens_per_s": predicted,
                     "weight_bytes": weight_bytes(target.model)})
    return out, rows


def _kit_decode(target, ids, proposer, budget, cfg) -> tuple:
    """(tokens, decode tokens, decode seconds, tau)."""
    res = generate(target, ids, proposer, budget=budget, max_new_tokens=cfg.max_new_tokens)
    return res.tokens, sum(len(r.committed) for r in res.rounds), res.decode_s, res.tau


def _llama_decode(llm, ids, cfg, eos) -> tuple:
    toks, n, secs = llama_cpp_ar(llm, ids, cfg.max_new_tokens, eos)
    return toks, n, secs, None


def timed_runs(backends: dict, prompts: list[dict], cfg: BackendsConfig, llms: dict) -> dict:
    """(backend, method) -> one list per repeat of (tokens, decode tokens, seconds, tau) per prompt."""
    first = next(iter(backends.values()))[0]
    encoded = [first.encode(p["prompt"]) for p in prompts]
    eos = first.eos_ids
    keys = [(b, m) for b, (_, _, methods) in backends.items() for m in methods] + [("llama.cpp", m) for m in llms]
    runs = {k: [[] for _ in range(cfg.repeats)] for k in keys}
    for rep in range(cfg.repeats):
        for ids in encoded:
            for b, m in keys:
                if b == "llama.cpp":
                    runs[(b, m)][rep].append(_llama_decode(llms[m], ids.tolist(), cfg, eos))
                else:
                    target, budget, methods = backends[b]
                    runs[(b, m)][rep].append(_kit_decode(target, ids, methods[m], budget, cfg))
    return runs


def _rate(rep_runs) -> float:
    return sum(r[1] for r in rep_runs) / max(sum(r[2] for r in rep_runs), 1e-9)


def decode_rows(runs: dict, backends: dict, cfg: BackendsConfig, cpu: dict) -> list[dict]:
    """One row per configuration: median tokens/s over repeats, its ratio to llama.cpp's AR and to the
    same backend's AR within each repeat, tau, identical_to_ar over the prompts of the first repeat."""
    ref = runs.get(("llama.cpp", "ar"))
    rows = []
    for (b, m), reps in runs.items():
        own = runs[(b, "ar")]
        taus = [r[3] for r in reps[0] if r[3] is not None]
        rows.append({
            "kind": "decode", "backend": b, "method": m,
            "budget": None if m == "ar" or b == "llama.cpp" else backends[b][1],
            "tokens_per_s": statistics.median(_rate(r) for r in reps),
            "vs_own_ar": statistics.median(_rate(r) / _rate(a) for r, a in zip(reps, own)),
            "vs_llama_cpp_ar": None if ref is None else statistics.median(
                _rate(r) / _rate(a) for r, a in zip(reps, ref)),
            "tau": statistics.mean(taus) if taus else None, "n": len(reps[0]),
            "new_tokens": sum(len(r[0]) for r in reps[0]),
            "identical_to_ar": sum(x[0] == y[0] for x, y in zip(reps[0], own[0])),
            "threads": cfg.threads, **cpu})
    return rows


def _common_prefix(a: list, b: list) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def agreement_rows(runs: dict) -> list[dict]:
    """Every backend's AR against fp32's AR and llama.cpp's AR (where they ran), prompt by prompt over
    the first repeat: outputs identical token for token, and the mean length of the common prefix."""
    refs = {key: runs[(ref, "ar")][0] for ref, key in (("fp32", "fp32"), ("llama.cpp", "llama_cpp"))
            if (ref, "ar") in runs}
    rows = []
    for (b, m), reps in runs.items():
        if m == "ar":
            row = {"kind": "agreement", "backend": b, "n": len(reps[0])}
            for key, ref in refs.items():
                row[f"same_as_{key}_ar"] = sum(x[0] == y[0] for x, y in zip(reps[0], ref))
                row[f"common_prefix_{key}"] = statistics.mean(_common_prefix(x[0], y[0]) for x, y in zip(reps[0], ref))
            rows.append(row)
    return rows


def llama_cpp_verify_rows(llm, prompt: list[int], decode: list[dict]) -> list[dict]:
    """llama.cpp's verify curve (chain and tree, the issue's sizes and this run's tree sizes), its batched
    verify against its AR on a real prompt, and the llama.cpp-as-verifier bound of every head-method row."""
    curve = verify_curve(llm, tuple(sorted({*SIZES, *(b + 1 for b in AUTO_CANDIDATES)})))
    return curve + [ar_agreement(llm, prompt, 32)] + route_rows(decode, curve)


def _llms(cfg: BackendsConfig, n_ctx: int) -> dict:
    if not cfg.llama_cpp:
        return {}
    try:
        return {"ar": llama_cpp_model(cfg.threads, n_ctx), "lookup": llamacpp.load_lookup(cfg.threads, n_ctx)}
    except ValueError:  # llama-cpp-python (the bench extra) not installed
        return {}


@torch.no_grad()
def measure(cfg: BackendsConfig = BackendsConfig(), data_dir=None) -> list[dict]:
    """All rows of one run: setup, bandwidth, one backend row each, one decode row per configuration."""
    torch.set_num_threads(cfg.threads)
    cpu = {"cpu": hardware.cpu_model(), "bf16_native": bool(hardware.cpu_bf16_flags())}
    prompts = _prompts(cfg, data_dir)
    setup = {"kind": "setup", "hardware": hardware.describe(), "torch": torch.__version__, **cpu,
             "gguf": embedded_gguf().name, "gguf_bytes": embedded_gguf().stat().st_size,
             "prompts": [p["id"] for p in prompts], "load_average_before": os.getloadavg()[0], "config": asdict(cfg)}
    rows = [setup, *({"kind": "bandwidth", **copy_bandwidth(mib, threads=cfg.threads)} for mib in BANDWIDTH_MIB)]
    backends, backend_rows = _setup_backends(cfg, prompts)
    rows += backend_rows
    llms = _llms(cfg, 2048)
    setup["llama_cpp"] = llamacpp.version() if llms else None
    runs = timed_runs(backends, prompts, cfg, llms)
    decode = decode_rows(runs, backends, cfg, cpu)
    rows += decode + agreement_rows(runs)
    if llms:
        first = next(iter(backends.values()))[0]
        rows += llama_cpp_verify_rows(llms["ar"], first.encode(prompts[0]["prompt"]).tolist(), decode)
    for llm in llms.values():
        llm.close()
    setup["load_average_after"] = os.getloadavg()[0]
    return rows


def add_arguments(parser) -> None:
    """The flags of the backend comparison (on top of ``speed``'s own)."""
    parser.add_argument("--backends", type=lambda s: tuple(n for n in s.split(",") if n), default=None,
                        help="compare these backends (fp32,bf16,int8,q4) beside llama.cpp on prompts (one JSON row each)")
    parser.add_argument("--prompts-file", help="JSONL of {id, prompt} for the backend comparison")
    parser.add_argument("--dataset", default=BackendsConfig.dataset, help="backend comparison's prompts")
    parser.add_argument("--skip", type=int, default=0, help="backend comparison: skip this many prompts first")
    parser.add_argument("--budget", default="auto", help="backend comparison: a budget or auto (per backend)")
    parser.add_argument("--json", action="store_true", help="backend comparison: print one JSON row per configuration")


def wanted(args) -> bool:
    return bool(args.backends or args.prompts_file or args.json)


def config_of(args) -> BackendsConfig:
    return BackendsConfig(backends=args.backends or BackendsConfig.backends, methods=args.methods,
                          budget=None if args.budget == "auto" else int(args.budget), dataset=args.dataset,
                          skip=args.skip, limit=args.limit, prompts_file=args.prompts_file,
                          max_new_tokens=args.max_new_tokens, repeats=args.repeats, threads=args.threads,
                          llama_cpp=not args.no_llama_cpp)


def run_args(args) -> int:
    from .backends_table import to_markdown
    rows = measure(config_of(args))
    if args.json:
        for r in rows:
            if r["kind"] == "decode":
                print(json.dumps(r), flush=True)
    else:
        print(to_markdown(rows))
    if args.out:
        write_rows(rows, args.out, to_markdown)
    return 0


def speed_arguments(parser) -> None:
    """``python -m jetflow speed``: the compiled-target run's flags and the backend comparison's."""
    from . import speed
    speed.add_arguments(parser)
    add_arguments(parser)


def speed_run(args) -> int:
    """The backend comparison when asked for (``--backends``, ``--prompts-file`` or ``--json``), else the compiled run."""
    from . import speed
    return run_args(args) if wanted(args) else speed.run_args(args)
