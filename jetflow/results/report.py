"""The result tables of the README and docs/, placed in their documents and checked against the committed rows
in ``data/results/`` (each table rendered by ``jetflow.results.tables``).

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

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from jetflow.util.paths import REPO as ROOT
from .ablation import ablation_markdown
from .tables import (by_dataset, correction_gain, decoded, grid, headline, replay_tau, same_steps, sampling,
                     sibling_headline, sibling_heldout, speed_auto, stop_vs_fixed, tau_curve, train_throughput,
                     trees_vs_ddtree)

README, RESULTS = ROOT / "README.md", ROOT / "data" / "results"

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
    "sibling-heldout": sibling_heldout,
    "sibling-headline": sibling_headline,
    "corrections": lambda res: ablation_markdown(res, [f"cpu-corrections-{v}" for v in ("pc", "pcb", "pcs")],
                                                 "data/heads/smollm2-135m-jetflow-pool1"),
}


DOCUMENTS: dict[str, tuple[str, ...]] = {  # document (relative to the checkout) -> its tables
    "README.md": ("headline", "sibling-headline"),
    "docs/scale.md": ("train-throughput", "tau-curve", "curve-one-pass", "curve-correction"),
    "docs/results.md": ("replay-tau", "gsm8k-fp32", "math500-fp32", "speed-bf16", "baselines-bf16", "table-bf16",
                        "merged-bf16", "merged-fp32", "merged-auto", "replay-tau-merged", "replay-trees",
                        "replay-stop", "replay-correction", "sampling", "pc-bf16", "pc-fp32", "pool1-correction",
                        "pool1-fp32", "pool1-fp32-budget", "sibling-heldout", "corrections"),
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
