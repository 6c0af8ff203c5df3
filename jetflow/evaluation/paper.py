"""The paper's published Qwen3-8B numbers, and a bench's rows beside them.

    print(beside_paper(rows))   # rows of `bench --preset qwen3-8b-quick` (or qwen3-8b): tau and speedup vs the paper

``PUBLISHED`` is the JetFlow/JetSpec paper's headline table (arXiv 2606.18394, "JetSpec: Breaking the Scaling
Ceiling of Speculative Decoding with Parallel Tree Drafting"): Qwen3-8B on one H100, greedy, its speedup over its
own AR and its tau, keyed by (method, paper budget = verified nodes including the root; this kit's budget is one
less). Its MATH-500 JetSpec number at 256 (9.64x, tau 10.76) is also stated on the authors' summary page
(haoailab.com/summary/parallel-tree-drafting). The paper's DFlash and DDTree rows use a bidirectional head its
authors retrained; this kit's ``qwen3-8b`` presets pair those methods with z-lab's published head
(``HEAD_LABELS``), so those rows are not expected to match.
"""
from __future__ import annotations

from collections.abc import Sequence

PAPER = "arXiv 2606.18394 (JetSpec), headline table: Qwen3-8B, one H100, greedy"
# (method, paper budget) -> {dataset: (paper speedup over its AR, paper tau)}
PUBLISHED = {
    ("dflash", 16): {"gsm8k": (4.80, 6.01), "math500": (6.12, 7.83), "humaneval": (4.14, 5.18),
                     "mbpp": (3.96, 4.98), "mt_bench": (2.72, 4.03)},
    ("ddtree", 256): {"gsm8k": (7.04, 7.77), "math500": (8.78, 9.81), "humaneval": (6.31, 6.96),
                      "mbpp": (6.09, 6.70), "mt_bench": (4.26, 5.41)},
    ("jetflow", 16): {"gsm8k": (4.80, 6.00), "math500": (6.06, 7.75), "humaneval": (4.26, 5.32),
                      "mbpp": (3.97, 4.96), "mt_bench": (2.68, 3.98)},
    ("jetflow", 64): {"gsm8k": (5.98, 6.56), "math500": (6.76, 7.42), "humaneval": (5.53, 6.06),
                      "mbpp": (5.34, 5.88), "mt_bench": (3.97, 4.77)},
    ("jetflow", 256): {"gsm8k": (7.82, 8.62), "math500": (9.64, 10.76), "humaneval": (7.12, 7.78),
                       "mbpp": (6.73, 7.43), "mt_bench": (4.58, 5.94)},
}
# which head a published checkpoint is, for the rows and tables that name it
HEAD_LABELS = {
    "JetSpec/jetspec-qwen3-8b": "JetSpec's published causal head (the paper's own)",
    "z-lab/Qwen3-8B-DFlash-b16": "z-lab's published DFlash head, not the bidirectional head the paper retrained "
                                 "for its DFlash/DDTree rows",
}
SPEEDUP_HEAD = "speedup over this run's AR (decode only, prefill out)"


def head_label(head: str | None) -> str:
    """A row's ``head`` (hub id or folder) as the tables name it: the published heads described, others as is."""
    if head is None:
        return "-"
    return f"{head}: {HEAD_LABELS[head]}" if head in HEAD_LABELS else head


def paper_row(method: str, paper_budget: int | None, dataset: str) -> tuple[float, float] | None:
    """(paper speedup, paper tau) of one cell of the paper's table, None where the paper has none."""
    return PUBLISHED.get((method, paper_budget), {}).get(dataset)


def _fmt(value, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def beside_paper(rows: Sequence[dict]) -> str:
    """Markdown: every decoded row with a paper budget, its tau and speedup beside the paper's at the same
    method, paper budget and dataset ('-' where the paper reports none), the head it drafted with, and the
    sources named under the table."""
    head = ["method", "dataset", "budget (kit)", "paper budget", "tau", "paper tau", SPEEDUP_HEAD,
            "paper speedup over its AR (prefill out)", "identical to AR", "head"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.get("paper_budget") is None or r.get("tau") is None:
            continue
        paper = paper_row(r["method"], r["paper_budget"], r["dataset"])
        lines.append("| " + " | ".join([
            r["method"], r["dataset"], str(r["budget"]), str(r["paper_budget"]), _fmt(r["tau"]),
            _fmt(paper and paper[1]), _fmt(r.get("speedup"), "x"), _fmt(paper and paper[0], "x"),
            f"{r['identical_to_ar']}/{r['n_prompts']}", r.get("head") or "-"]) + " |")
    heads = sorted({r["head"] for r in rows if r.get("head")})
    notes = [f"Paper: {PAPER}; its speedups are over its own AR on its engine, ours over AR in this run."]
    notes += [f"- {head_label(h)}" for h in heads if h in HEAD_LABELS]
    return "\n".join(lines + [""] + notes) + "\n"
