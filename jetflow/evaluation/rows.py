"""A result folder's format: ``rows.json`` (the list of rows) and ``table.md`` beside it, written by ``write_rows``.

A row is a plain dict: what one method measured on one dataset at one budget, with the setup it ran in
(``jetflow.util.hardware.environment``). ``bench_markdown`` renders a bench's rows (the tau/budget/speedup
conventions above the table, the setup and the rows' notes below), ``replay_markdown`` a replay's (tau
only). The notes a row may carry (``HF_NOTE``, ``CHAIN_NOTE``, ``REPLAY_NOTE``) are written here and read by
the report; ``at_budget`` picks the rows of one budget.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from jetflow.engine.metrics import predicted_speedups, round_stats
from .paper import HEAD_LABELS, SPEEDUP_HEAD, beside_paper

HF_NOTE = "transformers generate: prefill not separable, decode_s is the total time"
CHAIN_NOTE = "its trees stop growing below this budget: the same runs as budget {}"
REPLAY_NOTE = "replay: greedy rounds walked over one AR decode per prompt (tau only, no timing)"
CONVENTIONS = ("tau = mean tokens committed per round including the bonus token; budget = draft nodes "
               "excluding the root; speedup = decode tokens/s over AR in the same run, prefill excluded")
PAPER_NOTE = "; paper budget = verified nodes including the root (budget + 1), the paper's count"


def write_rows(rows: Sequence[dict], out_dir: str | os.PathLike, markdown=None) -> Path:
    """Write ``rows.json`` (the list of rows) and ``table.md`` (``markdown(rows)``, default ``bench_markdown``)
    under ``out_dir``; returns the folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rows.json").write_text(json.dumps(list(rows), indent=2) + "\n")
    (out / "table.md").write_text((markdown or bench_markdown)(rows))
    return out


def at_budget(rows: list[dict], budget: int) -> list[dict]:
    """The rows replayed at ``budget``; a budget the rows lack is an error naming the ones they have."""
    picked = [r for r in rows if r["budget"] == budget]
    if not picked:
        raise ValueError(f"no row at budget {budget}; the rows have budgets {sorted({r['budget'] for r in rows})}")
    return picked


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


CONTINUATION_NOTE = ("sibling cont. = after an accepted node that was not its parent's most probable child, how "
                     "often the target's next token was that node's own first child (rounds counted in brackets); "
                     "spine cont. = the same after an accepted first child; '-' for chains, which never branch")


def continuation_cell(row: dict, kind: str) -> str:
    """``0.42 (118)``: a row's ``{kind}_continuation`` with its count, ``-`` where it has none."""
    value, n = row.get(f"{kind}_continuation"), row.get(f"{kind}_n")
    return "-" if value is None else f"{value:.2f} ({n})"


def has_continuation(rows: Sequence[dict]) -> bool:
    """Whether the rows were measured with the continuation columns (rows before them render as before)."""
    return any("sibling_continuation" in r for r in rows)


def bench_markdown(rows: Sequence[dict]) -> str:
    """A markdown table of the rows, the tau/budget/speedup conventions above it, the setup below."""
    predicted = any("predicted_tokens_per_s" in r for r in rows)
    cont = has_continuation(rows)
    paper = any("paper_budget" in r for r in rows)  # rows before it was recorded render as they always did
    heads = any("head" in r for r in rows)
    head = ["method", "dataset", "budget", *(["paper budget"] if paper else []), "n", "new tokens", "tau",
            *(["sibling cont.", "spine cont."] if cont else []), "verify tokens", "prefill s", "decode s",
            "tokens/s", *(["predicted tokens/s"] if predicted else []), SPEEDUP_HEAD,
            *(["predicted " + SPEEDUP_HEAD] if predicted else []), "identical to AR", *(["head"] if heads else [])]
    lines = [CONVENTIONS + (PAPER_NOTE if paper else "") + (f"; {CONTINUATION_NOTE}" if cont else "") + ".", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, ratio in zip(rows, predicted_speedups(rows)):
        cells = [r["method"], r["dataset"], _fmt(r["budget"]), *([_fmt(r.get("paper_budget"))] if paper else []),
                 _fmt(r["n_prompts"]), _fmt(r["new_tokens"]),
                 _fmt(r["tau"]), *([continuation_cell(r, "sibling"), continuation_cell(r, "spine")] if cont else []),
                 _fmt(r["verify_tokens"], 1), _fmt(r["prefill_s"]), _fmt(r["decode_s"]),
                 _fmt(r["tokens_per_s"], 1), *([_fmt(r.get("predicted_tokens_per_s"), 1)] if predicted else []),
                 _fmt(r["speedup"]) + ("x" if r["speedup"] is not None else ""),
                 *([_fmt(ratio) + ("x" if ratio is not None else "")] if predicted else []),
                 f"{r['identical_to_ar']}/{r['n_prompts']}", *([r.get("head") or "-"] if heads else [])]
        lines.append("| " + " | ".join(cells) + " |")
    if rows:
        r = rows[0]
        lines += ["", f"{r['dtype']} on {r['device']} ({r['hardware']}); torch {r['torch']}, "
                      f"transformers {r['transformers']}."]
    notes = sorted({f"{r['method']}: {r['note']}" for r in rows if r.get("note")})
    lines += [f"- {n}" for n in notes]
    if any(r.get("head") in HEAD_LABELS for r in rows):  # the paper's target: its numbers beside ours
        lines += ["", "Beside the paper:", "", beside_paper(rows).rstrip("\n")]
    return "\n".join(lines) + "\n"


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
    if has_continuation(rows):
        lines += ["", continuation_markdown(rows).rstrip("\n")]
    return "\n".join(lines) + "\n"


def continuation_markdown(rows: Sequence[dict]) -> str:
    """Continuation table: one line per method (and width) x dataset x budget, sibling and spine with counts."""
    lines = ["| method | width | dataset | budget | tau | sibling cont. | spine cont. |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r.get('width') or '-'} | {r['dataset']} | {r['budget']} | {_fmt(r['tau'])} | "
                     f"{continuation_cell(r, 'sibling')} | {continuation_cell(r, 'spine')} |")
    return "\n".join(lines + ["", CONTINUATION_NOTE + "."]) + "\n"


def continuation_summary(rounds_by_label: dict) -> list[dict]:
    """One row per label of decoded or replayed rounds (e.g. ``{"ddtree": res.rounds}``): tau beside the
    continuation after an accepted sibling and after an accepted first child, with their counts (for a
    notebook's table; None where a chain has no siblings)."""
    keys = ("tau", "sibling_continuation", "sibling_n", "spine_continuation", "spine_n")
    return [{"method": label, **{k: stats[k] for k in keys}}
            for label, stats in ((label, round_stats(rounds)) for label, rounds in rounds_by_label.items())]
