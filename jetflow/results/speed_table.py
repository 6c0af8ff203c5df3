"""The table.md of a speed run (``jetflow.results.speed``): one renderer per table of its rows, by ``kind``.

``to_markdown`` puts them together: the header (config, hardware, load), decode speed (llama.cpp beside),
the verify-cost curve, the head's draft pass, compile seconds, exactness, where a verify forward's time
goes, the verify curve under the probes, compiled against eager AR, and the versions.
"""
from __future__ import annotations

KINDS = ("setup", "compile", "verify", "draft", "decode", "exactness", "ar-agreement", "profile", "probe")


def _f(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def header(setup: dict) -> list[str]:
    """The title, the load average and what was decoded how."""
    cfg = setup["config"]
    load = " -> ".join(f"{setup[k]:.1f}" for k in ("load_average_before", "load_average_after") if k in setup)
    return [f"# Compiled target, {cfg['dtype']}, {cfg['threads']} threads: {setup['hardware']}", "",
            *([f"Load average (1 min) at the start and the end of the run: {load}.", ""] if load else []),
            f"{cfg['dataset']}, first {cfg['limit']} prompts, greedy, {cfg['max_new_tokens']} new tokens, "
            f"budget {cfg['budget']}; medians over {cfg['repeats']} interleaved repeats, prefill excluded. "
            "speedup = tokens/s over the same path's AR; vs eager AR = over eager AR in the same repeat.", "",
            "draft / verify ms = per round (verify includes accepting and committing).", ""]


def decode_table(rows: list[dict], cfg: dict) -> list[str]:
    """Decode tokens/s of every path and method, with its draft and verify ms per round."""
    lines = ["| path | method | tokens/s | speedup over the same path's AR (prefill out) | vs eager AR in the same repeat "
             "| tau | draft ms | verify ms | identical to AR |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['path']} | {r['method']} | {_f(r['tokens_per_s'], 1)} | {_f(r['speedup'])}x | "
                     f"{_f(r['vs_eager_ar'])}x | {_f(r['tau'])} | {_f(r.get('draft_ms'), 1)} | "
                     f"{_f(r.get('verify_ms'), 1)} | {r['identical_to_ar']}/{cfg['limit']} |")
    return lines


def verify_table(rows: list[dict], cfg: dict) -> list[str]:
    """The verify-cost curve per path: ms and AR steps of each size."""
    sizes = sorted({r["size"] for r in rows})
    cost = {(r["path"], r["size"]): r for r in rows}
    lines = ["", f"Verify cost over a {cfg['past_len']}-token prefix: ms (AR steps of the same path), "
             f"median of {cfg['verify_repeats']} interleaved sweeps.", "",
             "| path | " + " | ".join(f"{k} tokens" for k in sizes) + " |", "|---" * (len(sizes) + 1) + "|"]
    for path in sorted({r["path"] for r in rows}):
        lines.append(f"| {path} | " + " | ".join(
            f"{1e3 * cost[(path, k)]['seconds']:.1f} ({cost[(path, k)]['ar_steps']:.2f})" for k in sizes) + " |")
    return lines


def draft_table(rows: list[dict], cfg: dict) -> list[str]:
    """The head's draft pass eager against compiled, per method (nothing without draft rows)."""
    if not rows:
        return []
    lines = ["", "The head's draft pass (block of the head's slots + draft log-probs; extend excluded) over a "
             f"{rows[0]['context']}-row context, median of {cfg.get('draft_repeats')} interleaved "
             "timings; difference = compiled against eager.", "",
             "| method | head dtype | eager ms | compiled ms | max abs log-prob difference | depths whose argmax differs |",
             "|---|---|---|---|---|---|"]
    draft = {(r["method"], r["path"]): r for r in rows}
    for method in dict.fromkeys(r["method"] for r in rows):
        e, c = draft[(method, "eager")], draft[(method, "compiled")]
        lines.append(f"| {method} | {e['dtype']} | {1e3 * e['seconds']:.2f} | {1e3 * c['seconds']:.2f} | "
                     f"{c['max_abs_diff']:.2g} | {c['argmax_differs']} |")
    return lines


def compile_line(rows: list[dict], setup: dict) -> list[str]:
    """Compile seconds of every graph, one line."""
    return ["", "Compile seconds per graph (first call; inductor cache files before the run: "
            f"{setup['inductor_cache_files_before']}): "
            + ", ".join(f"{r['size']} tokens {r['seconds']:.0f} s" if r.get("graph", "target") == "target"
                        else f"{r['graph']}{'' if r['size'] is None else ' ' + str(r['size'])} {r['seconds']:.0f} s"
                        for r in rows) + ".", ""]


def exactness_line(rows: list[dict]) -> list[str]:
    """How many prompts of each method are identical to compiled AR, one line."""
    return ["Exactness (greedy, compiled): " + ", ".join(
        f"{r['method']} {r['identical_to_compiled_ar']}/{r['n_prompts']}" for r in rows)
        + " prompts identical to compiled AR.", ""]


def profile_table(rows: list[dict], cfg: dict) -> list[str]:
    """Where a verify forward's time goes, per path and size (nothing without profile rows)."""
    if not rows:
        return []
    lines = ["Where a verify forward's time goes (ms per forward, torch.profiler self times over a "
             f"{cfg['past_len']}-token prefix; other = norms, RoPE, fused kernels, cache writes, Python):", "",
             "| path | tokens | total | lm_head | linears | attention | other |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['path']} | {r['size']} | " + " | ".join(f"{r[k]:.1f}" for k in
              ("total_ms", "lm_head", "linears", "attention", "other")) + " |" for r in rows]
    return lines + [""]


def probe_table(rows: list[dict], sizes: list[int]) -> list[str]:
    """The verify curve under one change each, per probe and path (nothing without probe rows)."""
    if not rows:
        return []
    lines = ["The verify curve under one change each (ms, AR steps of the same probe and path in parentheses):", "",
             "| probe | path | dtype | cache_len | freezing | " + " | ".join(f"{k} tokens" for k in sizes) + " |",
             "|---" * (len(sizes) + 5) + "|"]
    probe = {(r["probe"], r["path"], r["size"]): r for r in rows}
    for key in dict.fromkeys((r["probe"], r["path"]) for r in rows):
        first = probe[next(k for k in probe if k[:2] == key)]
        cells = [f"{1e3 * probe[(*key, k)]['seconds']:.1f} ({probe[(*key, k)]['ar_steps']:.2f})"
                 if (*key, k) in probe else "-" for k in sizes]
        lines.append(f"| {key[0]} | {key[1]} | {first['dtype']} | {first['cache_len']} | {first['freezing']} | "
                     + " | ".join(cells) + " |")
    return lines + [""]


def agreement_line(rows: list[dict]) -> list[str]:
    """Compiled AR against eager AR per prompt, one line."""
    return ["Compiled AR against eager AR: " + "; ".join(
        f"{r['prompt']}: " + ("identical" if r["first_difference"] is None else
                              f"first differs at token {r['first_difference']} (top-2 gap {r['top2_gap_there']:.3g})")
        for r in rows) + ".", ""]


def versions_line(setup: dict) -> str:
    return (f"torch {setup['torch']}, transformers {setup['transformers']}, GGUF {setup['gguf']}"
            + (f", llama-cpp-python {setup['llama_cpp']}" if setup["llama_cpp"] else ", llama.cpp not run"))


def to_markdown(rows: list[dict]) -> str:
    """The run's tables: decode speed (llama.cpp beside), the verify-cost curve, compile seconds,
    exactness, and the hardware line."""
    if any(r["kind"] == "bandwidth" for r in rows):  # a backend comparison (jetflow.results.backends)
        from .backends_table import to_markdown as backends_markdown
        return backends_markdown(rows)
    by = {k: [r for r in rows if r["kind"] == k] for k in KINDS}
    setup = by["setup"][0]
    cfg = setup["config"]
    sizes = sorted({r["size"] for r in by["verify"]})
    lines = [*header(setup), *decode_table(by["decode"], cfg), *verify_table(by["verify"], cfg),
             *draft_table(by["draft"], cfg), *compile_line(by["compile"], setup), *exactness_line(by["exactness"]),
             *profile_table(by["profile"], cfg), *probe_table(by["probe"], sizes), *agreement_line(by["ar-agreement"]),
             versions_line(setup)]
    return "\n".join(lines) + "\n"
