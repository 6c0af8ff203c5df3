"""``bench --plan``: what a bench would run (prompts x methods x budgets) and a rough cost, starting nothing.

No model, head or prompt loads: the datasets count as their full test splits (capped by ``limit``), a prompts
file by its lines. The time is an order of magnitude from stated assumptions, not a measurement.
"""
from __future__ import annotations

from pathlib import Path

from jetflow.drafting import methods as registry

# rows of each dataset's test split (the bench's prompts without --limit)
TEST_SIZES = {"gsm8k": 1319, "math500": 500, "humaneval": 164, "mbpp": 500, "mt_bench": 80, "spec_bench": 480}
AR_TOKENS_PER_S = 35.0   # assumed: transformers-eager AR of an 8B target on one H200 (25-45 tok/s)
SPEC_SPEEDUP = 3.0       # assumed: a speculative configuration's decode speed over AR
TYPICAL_NEW_TOKENS = 400  # assumed: a typical answer's length when max_new_tokens is larger


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


def plan(cfg) -> dict:
    """The plan of a ``BenchConfig``: prompt counts, configurations, new tokens and rough hours."""
    counts, configs = prompt_counts(cfg), configurations(cfg)
    prompts = sum(counts.values())
    spec = sum("@" in c for c in configs)
    ar_like = len(configs) - spec  # ar and transformers' own generate run at AR speed
    seconds_per_token = (ar_like + spec / SPEC_SPEEDUP) / AR_TOKENS_PER_S
    typical = min(cfg.max_new_tokens, TYPICAL_NEW_TOKENS)
    return {"prompts": counts, "n_prompts": prompts, "configurations": configs,
            "max_new_tokens_total": prompts * len(configs) * cfg.max_new_tokens,
            "hours_upper": prompts * cfg.max_new_tokens * seconds_per_token / 3600,
            "hours_typical": prompts * typical * seconds_per_token / 3600, "typical_new_tokens": typical}


def plan_text(cfg, name: str = "") -> str:
    """``plan(cfg)`` as the lines ``bench --plan`` prints."""
    p = plan(cfg)
    source = f"lines of {cfg.prompts_file}" if cfg.prompts_file else "full test splits, capped by --limit; not loaded"
    by_method: dict[str, list[str]] = {}
    for c in p["configurations"]:
        m, _, b = c.partition("@")
        by_method.setdefault(m, []).extend([b] if b else [])
    methods = "; ".join(f"{m}@{','.join(bs)}" if bs else m for m, bs in by_method.items())
    gpu = str(cfg.device or "cpu").startswith("cuda")
    return "\n".join([
        f"plan{' of preset ' + name if name else ''}: {cfg.model or 'the embedded SmolLM2'} in {cfg.dtype} "
        f"on {cfg.device or 'cpu'}",
        "prompts: " + ", ".join(f"{d} {n}" for d, n in p["prompts"].items()) + f" = {p['n_prompts']} ({source})",
        f"configurations: {methods} = {len(p['configurations'])}",
        f"runs: {p['n_prompts']} prompts x {len(p['configurations'])} configurations = "
        f"{p['n_prompts'] * len(p['configurations'])} decodes, at most {p['max_new_tokens_total']:,} new tokens",
        (f"rough time: ~{p['hours_typical']:.1f} h at {p['typical_new_tokens']} new tokens per answer, at most "
        f"~{p['hours_upper']:.1f} h if every answer runs to {cfg.max_new_tokens} (assumed: AR at "
        f"{AR_TOKENS_PER_S:g} tok/s, speculative configurations {SPEC_SPEEDUP:g}x faster; a chain method whose "
        "budgets share runs costs less)") if gpu else "rough time: estimated for a CUDA device only",
        "nothing was started: drop --plan to run it"])
