"""The result tables of the README and docs/, rendered from the committed rows in ``data/results/``.

Each table sits in its document between ``<!-- table:NAME -->`` and ``<!-- /table:NAME -->``;
``DOCUMENTS`` names the tables of each document (README.md holds the headline table, docs/results.md
every other one); a table the caller renders itself (the CLI's ``--help`` pages of docs/cli.md) comes in
as ``extra``. ``check`` compares those blocks with what the committed ``rows.json`` files give
today (a test runs it, so a published number cannot drift from its measurement); ``update`` rewrites
them after ``make results``:

    python -m jetflow report --check     # exit 1 and name every stale table, as DOCUMENT:NAME
    python -m jetflow report --write     # rewrite every table of every document

Cells: **tau / speedup (outputs identical to AR / prompts)**; tau alone for replayed rows.
"""
from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jetflow.drafting.methods import names
from jetflow.engine.metrics import predicted_speedups

from jetflow.util.paths import REPO as ROOT
README, RESULTS = ROOT / "README.md", ROOT / "data" / "results"
DATASET_NAMES = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mt_bench": "MT-Bench",
                 "mbpp": "MBPP", "spec_bench": "Spec-Bench"}
METHOD_ORDER = names()  # the registry's order
HF_NOTE = "transformers generate: prefill not separable, decode_s is the total time"
CHAIN_NOTE = "its trees stop growing below this budget: the same runs as budget {}"
REPLAY_NOTE = "replay: greedy rounds walked over one AR decode per prompt (tau only, no timing)"


def load(results: Path, *names: str) -> list[dict]:
    """The rows of the named result folders, concatenated; a missing folder is an error."""
    rows = []
    for name in names:
        path = Path(results) / name / "rows.json"
        if not path.exists():
            raise FileNotFoundError(f"{path} is missing: `make results` writes it")
        rows += json.loads(path.read_text())
    return rows


def cell(row: Mapping | None, *, bold: bool = False) -> str:
    """``tau / speedup (identical/n)``, the speedup in bold if asked; '-' for what a row lacks (hf has no tau)."""
    if row is None:
        return "-"
    tau = "-" if row.get("tau") is None else f"{row['tau']:.2f}"
    if "speedup" not in row:  # replayed: tau only
        return tau
    speed = "-" if row["speedup"] is None else f"{row['speedup']:.2f}x"
    speed = f"**{speed}**" if bold else speed
    return f"{tau} / {speed} ({row['identical_to_ar']}/{row['n_prompts']})"


def _md(head: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in body])


def _find(rows, method, dataset, budget=None):
    hits = [r for r in rows if r["method"] == method and r["dataset"] == dataset
            and (budget is None or r["budget"] in (budget, None))]
    return hits[0] if hits else None


def _methods(rows) -> list[str]:
    present = {r["method"] for r in rows}
    return [m for m in METHOD_ORDER if m in present] + sorted(present - set(METHOD_ORDER))


def _ar_rates(rows, dataset) -> str:
    rates = [f"{r['tokens_per_s']:.1f}" for r in rows if r["method"] == "ar" and r["dataset"] == dataset]
    return " / ".join(rates)


def _ar_line(rows) -> str:
    """The footer naming AR's tokens/s on every dataset of ``rows``, in order of appearance."""
    datasets = dict.fromkeys(r["dataset"] for r in rows)
    return "AR tokens/s: " + ", ".join(f"{_ar_rates(rows, ds)} on {DATASET_NAMES.get(ds, ds)}" for ds in datasets) + "."


# ----------------------------------------------------------------------------- tables
def replay_tau(results: Path, name: str = "cpu-replay-tau",
               methods: Sequence[str] = ("jetflow", "ddtree", "dflash", "jetflow-bp")) -> str:
    """tau against budget for every head method (JetFlow at width 7) on every replayed dataset."""
    rows = [r for r in load(results, name) if r.get("width") in (None, 7)]
    budgets = sorted({r["budget"] for r in rows})
    label = {"jetflow": "jetflow (W=7)"}
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for m in methods:
            got = {r["budget"]: r for r in rows if r["method"] == m and r["dataset"] == ds}
            if got:
                body.append([DATASET_NAMES.get(ds, ds), label.get(m, m), *(cell(got.get(b)) for b in budgets)])
    return _md(["dataset", "method", *(f"B={b}" for b in budgets)], body)


def trees_vs_ddtree(results: Path, name: str = "cpu-replay-trees", baseline: str = "ddtree") -> str:
    """Replayed tau of every causal-head builder beside DDTree's, one line per dataset and budget, each cell
    with its ratio to DDTree's tau, and the best causal-head method (JetFlow at width 7, the builders that
    take a width too; ``dflash``, the bidirectional chain, is shown but not ranked)."""
    rows = [r for r in load(results, name) if r.get("width") in (None, 7)]
    methods = [m for m in _methods(rows) if m != baseline]
    ranked = [m for m in methods if m.startswith("jetflow")]
    methods = ranked + [m for m in methods if m not in ranked]
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for b in sorted({r["budget"] for r in rows}):
            tau = {r["method"]: r["tau"] for r in rows if r["dataset"] == ds and r["budget"] == b}
            base = tau.get(baseline)
            best = max(ranked, key=lambda m: tau.get(m, 0.0))
            ratio = f"{tau[best] / base:.3f}x ({best})" if base else "-"
            body.append([DATASET_NAMES.get(ds, ds), str(b), f"{base:.2f}" if base else "-",
                         *(_vs(tau.get(m), base) for m in methods), ratio])
    return _md(["dataset", "budget", baseline, *methods, f"best / {baseline}"], body)


def _vs(tau: float | None, base: float | None) -> str:
    """``tau (ratio to base)``; '-' without a tau."""
    if tau is None:
        return "-"
    return f"{tau:.2f} ({tau / base:.2f})" if base else f"{tau:.2f}"


def stop_vs_fixed(results: Path, name: str = "cpu-replay-trees",
                  methods: Sequence[str] = ("jetflow-stop", "jetflow-cal", "jetflow-bp", "ddtree")) -> str:
    """The per-round budget against fixed budgets: per dataset and method, the budget (a cap for
    ``jetflow-stop``) with the highest predicted speedup over AR (from the rounds' sizes and the committed
    round-cost curve), its tau, mean draft nodes per round, tau per node and that prediction."""
    rows = [r for r in load(results, name) if r.get("predicted_speedup") is not None]
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for m in methods:
            got = [r for r in rows if r["dataset"] == ds and r["method"] == m]
            if not got:
                continue
            r = max(got, key=lambda r: (r["predicted_speedup"], -r["budget"]))
            body.append([DATASET_NAMES.get(ds, ds), m, str(r["budget"]), f"{r['tau']:.2f}", f"{r['nodes']:.1f}",
                         f"{r['tau_per_node']:.3f}", f"{r['predicted_speedup']:.2f}x"])
    return _md(["dataset", "method", "budget (best predicted)", "tau", "draft nodes / round", "tau / node",
                "predicted speedup"], body)


SAMPLING = (("greedy", "cpu-sampling-greedy"), ("T = 0.7", "cpu-sampling-t0.7"), ("T = 1.0", "cpu-sampling-t1.0"))


def sampling(results: Path, runs: Sequence[tuple[str, str]] = SAMPLING) -> str:
    """Decoded tau per dataset and method (AR left out) under greedy and sample-and-match decoding, one
    column per run, with the method's ratio to DDTree's tau in the same run."""
    by_run = {label: load(results, name) for label, name in runs}
    first = next(iter(by_run.values()))
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in first):
        for m in (m for m in _methods(first) if m != "ar"):
            cells = []
            for rows in by_run.values():
                row, base = _find(rows, m, ds), _find(rows, "ddtree", ds)
                cells.append(_vs(row and row["tau"], base and base["tau"] if m != "ddtree" else None))
            budget = _find(first, m, ds)["budget"]
            body.append([DATASET_NAMES.get(ds, ds), m, str(budget), *cells])
    return _md(["dataset", "method", "budget", *(f"tau, {label}" for label in by_run)], body)


def correction_gain(results: Path, name: str = "cpu-replay-correction",
                    corrected: Sequence[str] = ("jetflow-pc", "jetflow-pcx"), ddtree_from: str | None = None) -> str:
    """Replayed tau of the path-corrected builders (jetflow-pc, jetflow-pcx) beside the same best-prefix
    builder without the correction (jetflow-bp) and DDTree, per dataset and budget, with each one's ratio
    to both (a builder missing from the rows is left out). ``ddtree_from``: the DDTree rows come from that
    result instead (a head of the same training steps replayed there)."""
    rows = load(results, name)
    if ddtree_from is not None:
        rows = [r for r in rows if r["method"] != "ddtree"] + [r for r in load(results, ddtree_from)
                                                              if r["method"] == "ddtree"]
    mine = [m for m in corrected if any(r["method"] == m for r in rows)]
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for b in sorted({r["budget"] for r in rows}):
            tau = {r["method"]: r["tau"] for r in rows if r["dataset"] == ds and r["budget"] == b}
            ratio = lambda a, c: f"{tau[a] / tau[c]:.3f}x" if a in tau and c in tau else "-"
            body.append([DATASET_NAMES.get(ds, ds), str(b), *(f"{tau[m]:.2f}" if m in tau else "-"
                         for m in ("ddtree", "jetflow-bp", *mine)),
                         *(ratio(m, c) for m in mine for c in ("jetflow-bp", "ddtree"))])
    short = lambda m: m.removeprefix("jetflow-")
    return _md(["dataset", "budget", "ddtree", "jetflow-bp", *mine,
                *(f"{short(m)} / {short(c)}" for m in mine for c in ("jetflow-bp", "ddtree"))], body)


def decoded(results: Path, names: Sequence[str], dataset: str) -> str:
    """Decoded tau / speedup per method and budget from side-by-side runs (each with its own AR)."""
    runs = [load(results, n) for n in names]
    rows = [r for run in runs for r in run if r["dataset"] == dataset]
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    body = []
    for m in _methods(rows):
        if m == "ar":
            continue
        name = m + (" (chain: 15 drafts at most)" if m == "dflash" else "")
        body.append([name, *(cell(_find(rows, m, dataset, b)) for b in budgets)])
    ar = " and ".join(f"{_ar_rates(run, dataset)} tokens/s in `{n}`" for n, run in zip(names, runs))
    return _md(["method", *(f"budget {b}" for b in budgets)], body) + f"\n\nAR: {ar}."


def speed_auto(results: Path, names: Sequence[str]) -> str:
    """bf16 speed at fixed budgets with the ``--budgets ...,auto`` pick marked and its prediction."""
    rows = load(results, *names)
    for row, ratio in zip(rows, predicted_speedups(rows)):
        row["predicted_speedup"] = ratio
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for m in _methods(rows):
            got = {r["budget"]: r for r in rows if r["method"] == m and r["dataset"] == ds and r["budget"]}
            if not got:
                continue
            best = max(got.values(), key=lambda r: r["speedup"] or 0)
            cells = [cell(r, bold=r is best) + (" (auto)" if r and r.get("auto_budget") else "")
                     for r in map(got.get, budgets)]
            pick = next((r for r in got.values() if r.get("auto_budget")), None)
            pred = "-" if pick is None or pick.get("predicted_speedup") is None else f"{pick['predicted_speedup']:.2f}x"
            body.append([DATASET_NAMES.get(ds, ds), m, *cells, pred])
    head = ["dataset", "method", *(f"budget {b}" for b in budgets), "auto: predicted speedup"]
    return _md(head, body) + "\n\n" + _ar_line(rows)


def by_dataset(results: Path, names: Sequence[str]) -> str:
    """One column per dataset, one row per method (budget-free methods and single-budget runs)."""
    rows = load(results, *names)
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    body = []
    for m in _methods(rows):
        sub = [r for r in rows if r["method"] == m]
        budget = next((r["budget"] for r in sub if r["budget"] is not None), None)
        body.append([m + ("" if budget is None else f" (budget {budget})"),
                     *(cell(_find(rows, m, ds)) for ds in datasets)])
    return _md(["method", *(DATASET_NAMES.get(d, d) for d in datasets)], body) + "\n\n" + _ar_line(rows)


def grid(results: Path, names: Sequence[str]) -> str:
    """Every method at every budget, one block of rows per dataset; a budget-free method (``hf``,
    ``hf-lookup``) shows its one measurement in the first column. Each row's best speedup is in bold."""
    rows = load(results, *names)
    budgets = sorted({r["budget"] for r in rows if r["budget"] is not None})
    body = []
    for ds in dict.fromkeys(r["dataset"] for r in rows):
        for m in _methods(rows):
            got = {r["budget"]: r for r in rows if r["method"] == m and r["dataset"] == ds}
            if not got or m == "ar":
                continue
            if None in got:
                pad = [""] * (len(budgets) - 1)
                body.append([DATASET_NAMES.get(ds, ds), f"{m} (no budget)", cell(got[None]), *pad])
                continue
            best = max(got.values(), key=lambda r: r["speedup"] or 0)
            cells = [cell(r, bold=r is best) if (same := _reused(r)) is None else f"= budget {same}"
                     for r in map(got.get, budgets)]
            body.append([DATASET_NAMES.get(ds, ds), m, *cells])
    return _md(["dataset", "method", *(f"budget {b}" for b in budgets)], body) + "\n\n" + _ar_line(rows)


_REUSED = re.compile(re.escape(CHAIN_NOTE).replace(re.escape("{}"), r"(\d+)"))  # the note of older rows


def _reused(row: Mapping | None) -> int | None:
    """The budget whose runs a row repeats (its trees stop growing before its own budget), else None:
    the row's ``same_as_budget``, or in rows written before that field, the budget its note names."""
    if row and "same_as_budget" in row:
        return row["same_as_budget"]
    found = _REUSED.fullmatch((row or {}).get("note", ""))
    return int(found.group(1)) if found else None


# The headline: each method at its best budget in one named bf16 run (never the best of several runs).
HEADLINE = (("ar", "cpu-table-bf16"), ("lookup", "cpu-table-bf16"), ("ddtree", "cpu-table-bf16"),
            ("jetflow", "cpu-table-bf16"), ("jetflow-bp", "cpu-speed-bf16"), ("jetflow+lookup", "cpu-merged-bf16"))


def headline(results: Path, sources: Sequence[tuple[str, str]] = HEADLINE,
             datasets: Sequence[str] = ("gsm8k", "math500")) -> str:
    """One row per method, one column per dataset: the method's best speedup over the budgets of its
    source run (``SOURCE-DATASET``), with that budget; then the sources, the hardware and fp32's count."""
    body = []
    for method, source in sources:
        cells = []
        for ds in datasets:
            got = [r for r in load(results, f"{source}-{ds}") if r["method"] == method and _reused(r) is None]
            if not got:
                raise ValueError(f"{source}-{ds} has no {method} row")
            best = max(got, key=lambda r: r["speedup"] or 0)
            cells.append(cell(best) + ("" if best["budget"] is None else f", B={best['budget']}"))
        body.append([method, *cells])
    runs = {}
    for method, source in sources:
        runs.setdefault(source, []).append(method)
    named = "; ".join(f"`{src}-*`: {', '.join(ms)}" for src, ms in runs.items())
    first = load(results, f"{sources[0][1]}-{datasets[0]}")[0]
    return (_md(["method", *(DATASET_NAMES.get(d, d) for d in datasets)], body)
            + f"\n\nRuns (`data/results/`, each with its own AR): {named}. Hardware: {first['hardware']}, "
            f"{first['dtype']}, torch {first['torch']}. {_fp32_count(results)}")


def _fp32_count(results: Path) -> str:
    """How many decoded greedy fp32 outputs of the committed runs equal AR's (all must; sampled runs are
    checked by a distribution test instead)."""
    rows = [r for path in sorted(Path(results).glob("*/rows.json")) for r in json.loads(path.read_text())
            if r.get("dtype") == "float32" and "speedup" in r and r["method"] != "ar" and _reused(r) is None
            and not r.get("temperature")]
    same, total = sum(r["identical_to_ar"] for r in rows), sum(r["n_prompts"] for r in rows)
    return f"In fp32, {same} of {total} decoded outputs of the committed runs are identical to AR's."


def train_throughput(results: Path, name: str = "cpu-train-throughput") -> str:
    """Training slots per second, cached taps vs the online target (docs/scale.md)."""
    from .throughput import table
    return table(load(results, name))


def tau_curve(results: Path, name: str = "cpu-tau-curve") -> str:
    """Replayed tau of both heads against the training data they saw (docs/scale.md)."""
    from .curve import table
    return table(load(results, name))


def same_steps(results: Path) -> str:
    """The curve's k = 4 points beside the causal head trained for the same steps on all the data once (docs/scale.md)."""
    from .curve import same_steps_table
    return same_steps_table(load(results, "cpu-tau-curve"), load(results, "cpu-curve-one-pass"))


GRID = tuple(f"cpu-table-bf16-{ds}" for ds in ("gsm8k", "math500", "humaneval", "mt_bench"))
TABLES: dict[str, Callable[[Path], str]] = {
    "replay-tau": replay_tau,
    "gsm8k-fp32": lambda res: decoded(res, ["cpu-gsm8k-fp32-causal", "cpu-gsm8k-fp32-bidir"], "gsm8k"),
    "math500-fp32": lambda res: decoded(res, ["cpu-math500-fp32-causal", "cpu-math500-fp32-bidir"], "math500"),
    "speed-bf16": lambda res: speed_auto(res, ["cpu-speed-bf16-gsm8k", "cpu-speed-bf16-math500"]),
    "baselines-bf16": lambda res: by_dataset(res, ["cpu-baselines-bf16-gsm8k", "cpu-baselines-bf16-math500"]),
    "table-bf16": lambda res: grid(res, GRID),
    "merged-bf16": lambda res: grid(res, ["cpu-merged-bf16-gsm8k", "cpu-merged-bf16-math500"]),
    "merged-fp32": lambda res: grid(res, ["cpu-merged-fp32-gsm8k", "cpu-merged-fp32-math500"]),
    "merged-auto": lambda res: speed_auto(res, ["cpu-merged-auto-bf16-gsm8k", "cpu-merged-auto-bf16-math500"]),
    "replay-tau-merged": lambda res: replay_tau(res, "cpu-replay-tau-merged",
                                                  ("jetflow+lookup", "ddtree+lookup", "jetflow-bp+lookup")),
    "headline": headline,
    "replay-trees": trees_vs_ddtree,
    "train-throughput": train_throughput,
    "replay-correction": correction_gain,
    "replay-stop": lambda res: stop_vs_fixed(res, "cpu-replay-stop"),
    "sampling": sampling,
    "pc-bf16": lambda res: grid(res, ["cpu-pc-bf16-gsm8k", "cpu-pc-bf16-math500"]),
    "pc-fp32": lambda res: grid(res, ["cpu-pc-fp32-gsm8k", "cpu-pc-fp32-math500"]),
    "tau-curve": tau_curve,
    "curve-correction": lambda res: correction_gain(res, "cpu-curve-correction"),
    "curve-one-pass": lambda res: same_steps(res),
    "pool1-correction": lambda res: correction_gain(res, "cpu-pool1-correction", ddtree_from="cpu-curve-correction"),
    "pool1-fp32": lambda res: grid(res, ["cpu-pool1-fp32-gsm8k", "cpu-pool1-fp32-math500"]),
    "pool1-fp32-budget": lambda res: grid(res, ["cpu-pool1-fp32-budget-gsm8k", "cpu-pool1-fp32-budget-math500"]),
}


DOCUMENTS: dict[str, tuple[str, ...]] = {  # document (relative to the checkout) -> its tables
    "README.md": ("headline",),
    "docs/scale.md": ("train-throughput", "tau-curve", "curve-one-pass", "curve-correction"),
    "docs/results.md": ("replay-tau", "gsm8k-fp32", "math500-fp32", "speed-bf16", "baselines-bf16", "table-bf16",
                        "merged-bf16", "merged-fp32", "merged-auto", "replay-tau-merged", "replay-trees",
                        "replay-stop", "replay-correction", "sampling", "pc-bf16", "pc-fp32", "pool1-correction",
                        "pool1-fp32", "pool1-fp32-budget"),
}


# ----------------------------------------------------------------------------- document blocks
def _block(name: str) -> re.Pattern:
    """Opening marker line, the table (group 1, every line ending in a newline), closing marker."""
    return re.compile(rf"<!-- table:{re.escape(name)} -->\n((?:.*?\n)?)<!-- /table:{re.escape(name)} -->", re.S)


def markers(text: str) -> list[str]:
    """Names of the table blocks opened in a document's text (a marker on a line of its own), in order."""
    return re.findall(r"^<!-- table:([\w.+-]+) -->$", text, re.M)


def check_file(path: str | Path, names: Sequence[str], results: str | Path = RESULTS,
               tables: Mapping[str, Callable[[Path], str]] = TABLES) -> list[str]:
    """Those of ``names`` whose block in ``path`` is missing or differs from the committed rows."""
    text = Path(path).read_text()
    return [n for n in names if (found := _block(n).search(text)) is None
            or found.group(1) != tables[n](Path(results)) + "\n"]


def update_file(path: str | Path, names: Sequence[str], results: str | Path = RESULTS,
                tables: Mapping[str, Callable[[Path], str]] = TABLES) -> list[str]:
    """Rewrite the blocks ``names`` of ``path`` from the committed rows; returns the names that changed. A
    table whose markers are missing is an error (place the markers where the table belongs first)."""
    path = Path(path)
    text, changed = path.read_text(), []
    for name in names:
        pattern = _block(name)
        if pattern.search(text) is None:
            raise ValueError(f"{path} has no <!-- table:{name} --> ... <!-- /table:{name} --> block")
        body = tables[name](Path(results))
        new = pattern.sub(lambda m: f"<!-- table:{name} -->\n{body}\n<!-- /table:{name} -->", text)
        if new != text:
            changed.append(name)
        text = new
    path.write_text(text)
    return changed


Rendered = Mapping[str, Mapping[str, str]]  # document -> table name -> its text, rendered by the caller


def documents(extra: Rendered | None = None) -> dict[str, tuple[str, ...]]:
    """``DOCUMENTS`` with the tables of ``extra`` added (e.g. the CLI's ``--help`` pages in docs/cli.md)."""
    merged = dict(DOCUMENTS)
    for doc, texts in (extra or {}).items():
        merged[doc] = (*merged.get(doc, ()), *texts)
    return merged


def renderers(extra: Rendered | None = None) -> dict[str, Callable[[Path], str]]:
    """Table name -> its text from the rows folder: ``TABLES``, then the texts of ``extra``."""
    given = {name: text for texts in (extra or {}).values() for name, text in texts.items()}
    return {**TABLES, **{name: (lambda results, text=text: text) for name, text in given.items()}}


def check(readme: str | Path = README, results: str | Path = RESULTS, extra: Rendered | None = None) -> list[str]:
    """``DOCUMENT:NAME`` of every table in ``DOCUMENTS`` (and ``extra``) that is missing or stale (empty: all
    agree); the documents are found in the folder of ``readme`` (the checkout)."""
    root, tables = Path(readme).parent, renderers(extra)
    return [f"{doc}:{n}" for doc, names in documents(extra).items()
            for n in check_file(root / doc, names, results, tables)]


def update(readme: str | Path = README, results: str | Path = RESULTS, extra: Rendered | None = None) -> list[str]:
    """Rewrite every table of every document beside ``readme`` (and those of ``extra``); returns
    ``DOCUMENT:NAME`` of those that changed."""
    root, tables = Path(readme).parent, renderers(extra)
    return [f"{doc}:{n}" for doc, names in documents(extra).items()
            for n in update_file(root / doc, names, results, tables)]


CONVENTIONS = ("tau = mean tokens committed per round including the bonus token; budget = draft nodes "
               "excluding the root; speedup = decode tokens/s over AR in the same run, prefill excluded")


# ----------------------------------------------------------------------------- a result folder's table.md
def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def bench_markdown(rows: Sequence[dict]) -> str:
    """A markdown table of the rows, the tau/budget/speedup conventions above it, the setup below."""
    predicted = any("predicted_tokens_per_s" in r for r in rows)
    head = ["method", "dataset", "budget", "n", "new tokens", "tau", "verify tokens", "prefill s", "decode s",
            "tokens/s", *(["predicted tokens/s"] if predicted else []), "speedup",
            *(["predicted speedup"] if predicted else []), "identical to AR"]
    lines = [CONVENTIONS + ".", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, ratio in zip(rows, predicted_speedups(rows)):
        cells = [r["method"], r["dataset"], _fmt(r["budget"]), _fmt(r["n_prompts"]), _fmt(r["new_tokens"]),
                 _fmt(r["tau"]), _fmt(r["verify_tokens"], 1), _fmt(r["prefill_s"]), _fmt(r["decode_s"]),
                 _fmt(r["tokens_per_s"], 1), *([_fmt(r.get("predicted_tokens_per_s"), 1)] if predicted else []),
                 _fmt(r["speedup"]) + ("x" if r["speedup"] is not None else ""),
                 *([_fmt(ratio) + ("x" if ratio is not None else "")] if predicted else []),
                 f"{r['identical_to_ar']}/{r['n_prompts']}"]
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        r = rows[0]
        lines += ["", f"{r['dtype']} on {r['device']} ({r['hardware']}); torch {r['torch']}, "
                      f"transformers {r['transformers']}."]
    notes = sorted({f"{r['method']}: {r['note']}" for r in rows if r.get("note")})
    lines += [f"- {n}" for n in notes]
    return "\n".join(lines) + "\n"


def write_rows(rows: Sequence[dict], out_dir: str | os.PathLike, markdown=None) -> Path:
    """Write ``rows.json`` (the list of rows) and ``table.md`` (``markdown(rows)``, default ``bench_markdown``)
    under ``out_dir``; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(list(rows), indent=2) + "\n")
    (out / "table.md").write_text((markdown or bench_markdown)(rows))
    return out


def replay_markdown(rows: Sequence[dict]) -> str:
    """tau table: one line per method (and width) x dataset, one column per budget."""
    budgets = sorted({r["budget"] for r in rows})
    lines = ["| method | width | dataset | " + " | ".join(f"B={b}" for b in budgets) + " |",
             "|---|---|---|" + "---|" * len(budgets)]
    cells: dict[tuple, dict[int, float]] = {}
    for r in rows:
        cells.setdefault((r["method"], r["width"], r["dataset"]), {})[r["budget"]] = r["tau"]
    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    for (m, w, ds), by_b in sorted(cells.items(), key=lambda kv: datasets.index(kv[0][2])):
        lines.append(f"| {m} | {w or '-'} | {ds} | " +
                     " | ".join(f"{by_b[b]:.2f}" if by_b.get(b) is not None else "-" for b in budgets) + " |")
    lines.append("\ntau = mean tokens committed per round including the bonus token; budget = draft nodes "
                 "excluding the root; " + REPLAY_NOTE)
    return "\n".join(lines) + "\n"
