"""``bench --plan``: what a bench would run (prompts x methods x budgets), a rough cost in GPU time, the download
and the memory per method, starting nothing.

No model, head or prompt loads: the datasets count as their full test splits (capped by ``limit``), a prompts
file by its lines; the memory comes from the modules built on the meta device (``jetflow.evaluation.memory``).
The time is an order of magnitude from stated assumptions, not a measurement.
"""
from __future__ import annotations

from pathlib import Path

from jetflow.drafting import methods as registry
from . import memory

# rows of each dataset's test split (the bench's prompts without --limit)
TEST_SIZES = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500, "mt_bench": 80, "spec_bench": 480}
AR_TOKENS_PER_S = 35.0   # assumed: transformers-eager AR of an 8B target on one H200 (25-45 tok/s)
SPEC_SPEEDUP = 3.0       # assumed: a speculative configuration's decode speed over AR
TYPICAL_NEW_TOKENS = 400  # assumed: a typical answer's length when max_new_tokens is larger
CHAIN_DRAFTS = 15         # a chain (dflash) holds at most block size - 1 drafts: the published heads' block is 16
LOAD_S = 90.0             # assumed: reading the target and the heads from the local cache onto the GPU
DOWNLOAD_MB_S = 100.0     # assumed: hub download speed (MB/s)


def prompt_counts(cfg) -> dict[str, int]:
    """dataset (or the prompts file's stem) -> prompts the bench would decode, loading nothing."""
    cap = cfg.limit if cfg.limit is not None else float("inf")
    if cfg.prompts_file is not None:
        path = Path(cfg.prompts_file)
        lines = sum(1 for line in path.read_text().splitlines() if line.strip()) if path.is_file() else 0
        return {path.stem: int(min(lines, cap))}
    return {d: int(min(TEST_SIZES[d], cap)) for d in cfg.datasets}


def configurations(cfg) -> list[str]:
    """AR first, then each budget-free method once and each tree method at every budget (``method@budget``)."""
    out = ["ar"]
    for m in dict.fromkeys(cfg.methods):
        if m == "ar":
            continue
        out += [m] if registry.method(m).budget_free else [f"{m}@{b}" for b in cfg.budgets]
    return out


def decoded(configs: list[str]) -> list[str]:
    """The configurations that decode: a chain's budgets past ``CHAIN_DRAFTS`` reuse its run at that size."""
    out = []
    for c in configs:
        m, _, b = c.partition("@")
        if b and registry.method(m).builder == "chain" and int(b) > CHAIN_DRAFTS:
            c = f"{m}@{CHAIN_DRAFTS}" if f"{m}@{CHAIN_DRAFTS}" in configs else c
        out += [] if c in out else [c]
    return out


def plan(cfg) -> dict:
    """The plan of a ``BenchConfig``: prompt counts, configurations (and those that decode), new tokens, rough
    decode hours (``hours_typical``, ``hours_upper``) and the load time (``load_s``), in GPU time on one GPU."""
    counts, configs = prompt_counts(cfg), configurations(cfg)
    prompts, runs = sum(counts.values()), decoded(configs)
    spec = sum("@" in c for c in runs)
    ar_like = len(runs) - spec  # ar and transformers' own generate run at AR speed
    seconds_per_token = (ar_like + spec / SPEC_SPEEDUP) / AR_TOKENS_PER_S
    typical = min(cfg.max_new_tokens, TYPICAL_NEW_TOKENS)
    return {"prompts": counts, "n_prompts": prompts, "configurations": configs, "decoded": runs,
            "max_new_tokens_total": prompts * len(runs) * cfg.max_new_tokens,
            "hours_upper": prompts * cfg.max_new_tokens * seconds_per_token / 3600,
            "hours_typical": prompts * typical * seconds_per_token / 3600, "typical_new_tokens": typical,
            "load_s": LOAD_S}


def _duration(hours: float) -> str:
    return f"{hours * 60:.0f} min" if hours < 1 else f"{hours:.1f} h"


def time_lines(cfg, p: dict) -> list[str]:
    """The rough GPU time: decoding (typical and upper bound) plus loading, under the stated assumptions."""
    if not str(cfg.device or "cpu").startswith("cuda"):
        return ["rough time: estimated for a CUDA device only"]
    load_h = p["load_s"] / 3600
    return [f"rough GPU time (one GPU): ~{_duration(p['hours_typical'] + load_h)} at {p['typical_new_tokens']} new "
            f"tokens per answer, at most ~{_duration(p['hours_upper'] + load_h)} if every answer runs to "
            f"{cfg.max_new_tokens}; {_duration(load_h)} of it loading (assumed: AR at {AR_TOKENS_PER_S:g} tok/s, "
            f"speculative configurations {SPEC_SPEEDUP:g}x faster, loading {LOAD_S:g} s from a filled hub cache)"]


def memory_lines(cfg) -> list[str]:
    """Download size and the memory per method (``memory.estimate``), or why there is none."""
    est = memory.estimate(cfg)
    if est is None:
        return [f"memory: no estimate (the shape of {cfg.model or 'the embedded SmolLM2'} is not known here)"]
    users: dict[str, list[str]] = {}
    for m in cfg.methods:
        path = registry.head_path(m, cfg.heads)
        if path in est.heads:
            users.setdefault(path, []).append(m)
    heads = "; ".join(f"{path} {memory.gib(b)} ({' and '.join(users.get(path, ['-']))}"
                      f"{', one shared copy' if len(users.get(path, [])) > 1 else ''})" for path, b in est.heads.items())
    lines = [f"memory (meta-device estimate, {cfg.dtype}; a floor: no activations inside a layer, no allocator "
             f"slack): weights: target {memory.gib(est.target)}" + (f"; heads: {heads}" if heads else ""),
             f"memory: the whole bench holds {memory.gib(est.resident)} of weights, peak ~{memory.gib(est.run_peak)} "
             f"with the KV cache at {est.kv_rows} rows ({memory.PROMPT_TOKENS} prompt + {cfg.max_new_tokens} new + "
             f"budget + 1) and its largest verify; per method alone: "
             + ", ".join(f"{m} {memory.gib(b)}" for m, b in est.peak.items())]
    remote = [p for p in (cfg.model, *est.heads) if p and not Path(p).exists()]
    if remote:
        size = est.target * (cfg.model in remote) + sum(b for p, b in est.heads.items() if p in remote)
        gb = size / 1e9  # the published files hold bf16 weights: the same bytes as a bf16 run's
        lines.append(f"download (an empty hub cache): ~{gb:.1f} GB of {cfg.dtype} weights for {', '.join(remote)}: "
                     f"~{gb * 1e3 / DOWNLOAD_MB_S / 60:.0f} min at {DOWNLOAD_MB_S:g} MB/s (not counted above)")
    return lines


def plan_text(cfg, name: str = "") -> str:
    """``plan(cfg)`` as the lines ``bench --plan`` prints."""
    p = plan(cfg)
    source = f"lines of {cfg.prompts_file}" if cfg.prompts_file else "full test splits, capped by --limit; not loaded"
    by_method: dict[str, list[str]] = {}
    for c in p["configurations"]:
        m, _, b = c.partition("@")
        by_method.setdefault(m, []).extend([b] if b else [])
    methods = "; ".join(f"{m}@{','.join(bs)}" if bs else m for m, bs in by_method.items())
    shared = [c for c in p["configurations"] if c not in p["decoded"]]
    return "\n".join([
        f"plan{' of preset ' + name if name else ''}: {cfg.model or 'the embedded SmolLM2'} in {cfg.dtype} "
        f"on {cfg.device or 'cpu'}",
        "prompts: " + ", ".join(f"{d} {n}" for d, n in p["prompts"].items()) + f" = {p['n_prompts']} ({source})",
        f"configurations: {methods} = {len(p['configurations'])}"
        + (f" ({', '.join(shared)}: the same runs as at {CHAIN_DRAFTS} drafts, a chain's most)" if shared else ""),
        f"runs: {p['n_prompts']} prompts x {len(p['decoded'])} decoded configurations = "
        f"{p['n_prompts'] * len(p['decoded'])} decodes, at most {p['max_new_tokens_total']:,} new tokens",
        *time_lines(cfg, p), *memory_lines(cfg),
        "nothing was started: drop --plan to run it"])
