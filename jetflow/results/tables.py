"""The result tables of README.md and docs/: each a function from the committed rows in ``data/results/`` to
markdown (``jetflow.results.report`` places them in their documents and checks them).

``load`` reads the rows of named result folders; ``cell`` renders one row as
**tau / speedup (outputs identical to AR / prompts)**, tau alone for replayed rows. Methods appear in the
registry's order (``METHOD_ORDER``), datasets under their published names (``DATASET_NAMES``).
"""
from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from jetflow.drafting.methods import names
from jetflow.engine.metrics import predicted_speedups
from jetflow.evaluation.rows import CHAIN_NOTE
from . import curve, sibling, throughput

DATASET_NAMES = {"gsm8k": "GSM8K", "math500": "MATH-500", "humaneval": "HumanEval", "mt_bench": "MT-Bench",
                 "mbpp": "MBPP", "spec_bench": "Spec-Bench"}
METHOD_ORDER = names()  # the registry's order
# the header of a column of ``cell``s names the speedup's denominator
CELLS = "method: tau / speedup over the same run's AR, prefill out (identical to AR / n)"


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
                "predicted speedup over AR"], body)


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
    return _md([CELLS, *(f"budget {b}" for b in budgets)], body) + f"\n\nAR: {ar}."


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
    head = ["dataset", CELLS, *(f"budget {b}" for b in budgets), "auto: predicted speedup over AR"]
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
    return _md([CELLS, *(DATASET_NAMES.get(d, d) for d in datasets)], body) + "\n\n" + _ar_line(rows)


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
    return _md(["dataset", CELLS, *(f"budget {b}" for b in budgets)], body) + "\n\n" + _ar_line(rows)


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
    return (_md([CELLS, *(DATASET_NAMES.get(d, d) for d in datasets)], body)
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
    return throughput.table(load(results, name))


def tau_curve(results: Path, name: str = "cpu-tau-curve") -> str:
    """Replayed tau of both heads against the training data they saw (docs/scale.md)."""
    return curve.table(load(results, name))


def same_steps(results: Path) -> str:
    """The curve's k = 4 points beside the causal head trained for the same steps on all the data once (docs/scale.md)."""
    return curve.same_steps_table(load(results, "cpu-tau-curve"), load(results, "cpu-curve-one-pass"))


SIBLING_RUNS = {"whole-pool head (8,015 steps)": "cpu-sibling-pool1", "shipped head (4,200 steps)": "cpu-sibling-shipped"}
_SIBLING_NOTE = ("Replayed, fp32, greedy, prompts 21-30 of each dataset (`--skip 20 --limit 10`), 256 new tokens; "
                 "DFlash and DDTree draft with the shipped bidirectional head (4,200 steps) in both runs.")


def sibling_heldout(results: Path) -> str:
    """The held-out cells of issue 41: jetflow-pc against DDTree per causal head, dataset and budget."""
    runs = {label: load(results, name) for label, name in SIBLING_RUNS.items()}
    return _md(*sibling.margins(runs)) + "\n\n" + _SIBLING_NOTE


def sibling_headline(results: Path) -> str:
    """The README's second headline table: tau beside sibling continuation on the held-out prompts."""
    pool1, shipped = (load(results, name) for name in SIBLING_RUNS.values())
    table = _md(*sibling.headline([("dflash", "dflash", pool1), ("ddtree", "ddtree", pool1),
                              ("jetflow", "jetflow", shipped), ("jetflow-pc, shipped head", "jetflow-pc", shipped),
                              ("jetflow-pc, whole-pool head", "jetflow-pc", pool1)]))
    return (table + "\n\nRuns: `data/results/cpu-sibling-pool1` and `cpu-sibling-shipped`. " + _SIBLING_NOTE
            + " sibling cont. = after an accepted node that was not its parent's most probable child, how often the "
            "target's next token was that node's own first child; '-' for a chain, which never branches.")
