"""The table.md of a backend comparison (``jetflow.results.backends``): decode speed of every backend and
method beside llama.cpp on the same GGUF, the best lossless decode per backend against llama.cpp's AR,
and each backend's bytes per token against the machine's copy bandwidth."""
from __future__ import annotations


def _f(x, digits=2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _x(x) -> str:
    return "-" if x is None else f"{x:.2f}x"


def _header(setup: dict, copies: list[dict]) -> list[str]:
    cfg = setup["config"]
    where = (f"prompts file {cfg['prompts_file']}" if cfg["prompts_file"]
             else f"{cfg['dataset']} prompts {cfg['skip'] + 1}-{cfg['skip'] + len(setup['prompts'])}")
    load = " -> ".join(f"{setup[k]:.1f}" for k in ("load_average_before", "load_average_after") if k in setup)
    return [f"# Backends beside llama.cpp, {cfg['threads']} threads: {setup['cpu']}, bf16 "
            f"{'native' if setup['bf16_native'] else 'emulated'}", "",
            f"{setup['hardware']}; torch {setup['torch']}; llama-cpp-python {setup.get('llama_cpp') or 'absent'}; "
            f"{setup['gguf']}. {where}, greedy, up to {cfg['max_new_tokens']} new tokens, median of "
            f"{cfg['repeats']} interleaved repeat(s), prefill excluded; load average (1 min) {load}.", "",
            "tokens/s = decode tokens per second; x llama.cpp AR and x own AR are ratios within the same repeat; "
            "identical = prompts whose output equals the same backend's AR; budget = draft nodes "
            "(auto: picked per backend from its own verify-cost curve). Copy bandwidth (read + write): "
            + ", ".join(f"{c['gb_per_s']:.1f} GB/s over {c['mib']} MiB" for c in copies) + ".", ""]


def decode_table(rows: list[dict]) -> list[str]:
    lines = ["| backend | method | budget | tokens/s | x llama.cpp AR | x own AR | tau | identical to AR |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['method']} | {r['budget'] or '-'} | {_f(r['tokens_per_s'], 1)} | "
                     f"{_x(r['vs_llama_cpp_ar'])} | {_x(r['vs_own_ar'])} | {_f(r['tau'])} | "
                     f"{r['identical_to_ar']}/{r['n']} |")
    return lines


def best_table(rows: list[dict]) -> list[str]:
    """Per backend, its fastest configuration whose output equals its AR on every prompt."""
    lines = ["", "Best lossless decode per backend (identical to its own AR on every prompt):", "",
             "| backend | method | tokens/s | x llama.cpp AR |", "|---|---|---|---|"]
    for b in dict.fromkeys(r["backend"] for r in rows):
        ok = [r for r in rows if r["backend"] == b and r["identical_to_ar"] == r["n"]]
        if ok:
            r = max(ok, key=lambda r: r["tokens_per_s"])
            lines.append(f"| {b} | {r['method']} | {_f(r['tokens_per_s'], 1)} | {_x(r['vs_llama_cpp_ar'])} |")
    kit = [r for r in rows if r["backend"] != "llama.cpp" and r["identical_to_ar"] == r["n"]]
    if kit and any(r["vs_llama_cpp_ar"] is not None for r in kit):
        r = max(kit, key=lambda r: r["tokens_per_s"])
        lines += ["", f"The kit's best lossless decode: {r['backend']} {r['method']}, {_f(r['tokens_per_s'], 1)} "
                  f"tokens/s, {_x(r['vs_llama_cpp_ar'])} llama.cpp's AR."]
    return lines


def agreement_table(rows: list[dict]) -> list[str]:
    """Each backend's greedy AR output against fp32's and llama.cpp's, prompt by prompt."""
    if not rows:
        return []
    refs = [(k, name) for k, name in (("fp32", "fp32 AR"), ("llama_cpp", "llama.cpp AR")) if f"same_as_{k}_ar" in rows[0]]
    lines = ["", "AR outputs against fp32's and llama.cpp's (prompts identical token for token; mean common prefix "
             "in tokens):", "", "| backend | " + " | ".join(f"same as {n} | common prefix with {n}" for _, n in refs)
             + " |", "|---|" + "---|---|" * len(refs)]
    for r in rows:
        cells = [f"{r[f'same_as_{k}_ar']}/{r['n']} | {r[f'common_prefix_{k}']:.1f}" for k, _ in refs]
        lines.append(f"| {r['backend']} | " + " | ".join(cells) + " |")
    return lines


def llama_verify_table(curve: list[dict], agree: list[dict], route: list[dict]) -> list[str]:
    """llama.cpp's own verify-cost curve and the llama.cpp-as-verifier bound of each head method."""
    if not curve:
        return []
    sizes = sorted({r["size"] for r in curve})
    cell = {(r["shape"], r["size"]): r for r in curve}
    lines = ["", f"llama.cpp's verify cost: one batched decode of k tokens after a {curve[0]['past_len']}-token prefix, "
             "ms (its 1-token steps in parentheses); tree = a root shared by up to 4 paths, one sequence id each:", "",
             "| shape | " + " | ".join(f"{k} tokens" for k in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for shape in ("chain", "tree"):
        lines.append(f"| {shape} | " + " | ".join(f"{1e3 * cell[(shape, k)]['seconds']:.1f} ({cell[(shape, k)]['ar_steps']:.2f})"
                                                  for k in sizes) + " |")
    for a in agree:
        lines += ["", f"One batch of {a['size']} tokens against the same tokens one at a time: {a['same_argmax']}/"
                  f"{a['size']} next-token argmaxes equal llama.cpp's AR."]
    if route:
        lines += ["", "llama.cpp as the verifying target, modelled: tau of the kit's row over llama.cpp's tree decode of "
                  "budget + 1 tokens, drafting counted free (an upper bound):", "",
                  "| backend | method | budget | tau | llama.cpp verify ms | bound tokens/s | x llama.cpp AR "
                  "| kit tokens/s (measured) |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['backend']} | {r['method']} | {r['budget']} | {r['tau']:.2f} | {1e3 * r['verify_s']:.1f} | "
                  f"{r['bound_tokens_per_s']:.1f} | {_x(r['vs_llama_cpp_ar'])} | {r['kit_tokens_per_s']:.1f} |"
                  for r in route]
    return lines


def bytes_table(setup: dict, bw: dict, backends: list[dict], decode: list[dict]) -> list[str]:
    """Weight bytes per decoded token (AR reads every weight once) and the AR ceiling they allow."""
    ar = {r["backend"]: r["tokens_per_s"] for r in decode if r["method"] == "ar"}
    items = [(b["backend"], b["weight_bytes"], b) for b in backends] + [("llama.cpp", setup["gguf_bytes"], None)]
    lines = ["", f"Bytes per AR token against the copy bandwidth ({bw['gb_per_s']:.1f} GB/s over {bw['mib']} MiB, "
             f"{bw['threads']} threads; "
             "llama.cpp: the GGUF file's size):", "",
             "| backend | MB read per AR token | bandwidth ceiling tokens/s | AR tokens/s | share of ceiling "
             "| load s | compile s | auto budget |", "|---|---|---|---|---|---|---|---|"]
    for name, nbytes, b in items:
        ceiling = bw["gb_per_s"] * 1e9 / nbytes
        got = ar.get(name)
        lines.append(f"| {name} | {nbytes / 1e6:.0f} | {ceiling:.0f} | {_f(got, 1)} | "
                     f"{'-' if got is None else f'{100 * got / ceiling:.0f}%'} | {_f(b and b['load_s'], 1)} | "
                     f"{_f(b and b['compile_s'], 1)} | {(b and b['auto_budget']) or '-'} |")
    return lines


def to_markdown(rows: list[dict]) -> str:
    setup = next(r for r in rows if r["kind"] == "setup")
    copies = [r for r in rows if r["kind"] == "bandwidth"]
    bw = max(copies, key=lambda r: r["mib"])  # the copy past the caches: main memory's bandwidth
    decode = [r for r in rows if r["kind"] == "decode"]
    backends = [r for r in rows if r["kind"] == "backend"]
    kind = lambda k: [r for r in rows if r["kind"] == k]
    return "\n".join([*_header(setup, copies), *decode_table(decode), *best_table(decode),
                      *agreement_table(kind("agreement")), *bytes_table(setup, bw, backends, decode),
                      *llama_verify_table(kind("llama-verify"), kind("llama-verify-agreement"), kind("llama-route"))]) + "\n"
