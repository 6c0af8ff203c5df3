"""The results manifest: every committed folder under ``data/results/`` is one named entry here, its command
and the renderer of its ``table.md``.

    python -m jetflow results cpu-gsm8k-fp32-causal      # rerun it (resumable: the bench journals prompts)
    python -m jetflow results --batches results          # the entries of `make results`, a batch per line
    python -m jetflow results --render cpu-replay-tau    # rewrite table.md from the committed rows.json

All CPU results: the embedded SmolLM2-135M, greedy, 256 new tokens, the first 20 prompts of each dataset,
one torch thread per process. A group is what one ``make`` target reproduces; the entries of one batch
run side by side (two single-thread processes on a 2-core machine), and a bench interleaves its methods
prompt by prompt, so AR and the methods it is compared with always share a stretch of time.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .report import RESULTS
from jetflow.evaluation.rows import bench_markdown, replay_markdown

COMMON = ("--limit", "20", "--max-new-tokens", "256")
GRID_METHODS = "ar,hf,hf-lookup,lookup,dflash,ddtree,jetflow"
TREE_METHODS = ("jetflow,jetflow-bp,jetflow-cal,jetflow-t2g,jetflow-profile,jetflow-stop,jetflow-pc,jetflow-pcx,"
                "ddtree,dflash")
CORRECTION_METHODS = "jetflow-pc,jetflow-pcx,jetflow-bp,ddtree"
TREES_LIMIT = 8  # prompts per dataset of the diagnoses: the AR decodes that fitted one session on the shared 2-core CPU
REPLAY_DATASETS = ("--datasets", "gsm8k,math500,humaneval,mt_bench", "--budgets", "8,16,32,64,128,255")
SIBLING_METHODS = "dflash,ddtree,jetflow,jetflow-bp,jetflow-pc"
SIBLING_PROMPTS = ("--datasets", "gsm8k,humaneval,mt_bench", "--skip", "20", "--limit", "10", "--max-new-tokens", "256",
                   "--budgets", "16,64")
POOL1_HEAD = "data/heads/smollm2-135m-jetflow-pool1"  # the causal head of cpu-curve-one-pass (repository-relative)
CURVE_K = 4  # the curve point whose heads `make curve-correction` corrects and replays (the largest one replayed)


def curve_head(head: str, k: int = CURVE_K) -> str:
    """The folder of a curve point's head under the curve's default work folder (``make curve`` trains it)."""
    from .curve import CurveConfig, point_dir
    return str(point_dir(CurveConfig(out="-"), k, head))


@dataclass(frozen=True)
class Entry:
    name: str                        # the folder under data/results
    argv: tuple[str, ...]            # python -m jetflow ARGV --out data/results/NAME
    group: str                       # the make target that reproduces it: results | table | merged
    batch: int                       # entries of a group with the same batch run side by side

    @property
    def renderer(self) -> Callable[[list[dict]], str]:
        """rows -> the folder's table.md (the subcommand's own table)."""
        from .correction_cost import cost_markdown
        from .curve import to_markdown as curve_markdown
        from .diagnose import diagnosis_markdown
        from .speed_table import to_markdown as speed_markdown
        from .throughput import to_markdown as throughput_markdown
        from .verify_curve import to_markdown as verify_curve_markdown
        return {"replay": replay_markdown, "diagnose": diagnosis_markdown, "speed": speed_markdown,
                "correction-cost": cost_markdown, "throughput": throughput_markdown,
                "curve": curve_markdown, "verify-curve": verify_curve_markdown}.get(self.argv[0], bench_markdown)


def _bench(name, group, batch, methods, dataset, budgets, dtype, *extra) -> Entry:
    return Entry(name, ("bench", *COMMON, "--methods", methods, "--datasets", dataset, "--budgets", budgets,
                        "--dtype", dtype, *extra), group, batch)


def _pair(prefix, group, batch, methods, budgets, dtype, *extra) -> tuple[Entry, Entry]:
    """One bench per dataset, GSM8K and MATH-500, in the same batch."""
    return tuple(_bench(f"{prefix}-{ds}", group, batch, methods, ds, budgets, dtype, *extra)
                 for ds in ("gsm8k", "math500"))


ENTRIES: dict[str, Entry] = {e.name: e for e in (
    # make results: replayed tau (fp32), decoded fp32 on GSM8K and MATH-500, bf16 speed with the auto
    # budget beside every fixed candidate, the training-free baselines
    Entry("cpu-replay-tau", ("replay", *COMMON, *REPLAY_DATASETS, "--widths", "4,7,10"), "results", 1),
    _bench("cpu-gsm8k-fp32-causal", "results", 2, "ar,lookup,jetflow", "gsm8k", "16,64", "float32"),
    _bench("cpu-gsm8k-fp32-bidir", "results", 2, "ar,ddtree,dflash", "gsm8k", "16,64", "float32"),
    _bench("cpu-math500-fp32-causal", "results", 3, "ar,jetflow,jetflow-bp", "math500", "16", "float32"),
    _bench("cpu-math500-fp32-bidir", "results", 3, "ar,ddtree,dflash", "math500", "16", "float32"),
    *_pair("cpu-speed-bf16", "results", 4, "ar,jetflow,jetflow-bp", "8,16,32,auto", "bfloat16"),
    *_pair("cpu-baselines-bf16", "results", 5, "ar,hf,hf-lookup,lookup", "16", "bfloat16"),
    # make table: every method at budgets 16-255 on four datasets, bf16 (~1.5 h per dataset and core)
    *(_bench(f"cpu-table-bf16-{ds}", "table", batch, GRID_METHODS, ds, "16,32,64,128,255", "bfloat16")
      for batch, pair in ((1, ("gsm8k", "math500")), (2, ("humaneval", "mt_bench"))) for ds in pair),
    # make merged (beyond the paper): the heads' trees with prompt-lookup branches merged in
    *_pair("cpu-merged-bf16", "merged", 1, "ar,lookup,jetflow,jetflow+lookup,ddtree+lookup", "16,32", "bfloat16"),
    *_pair("cpu-merged-fp32", "merged", 2, "ar,jetflow+lookup,ddtree+lookup", "16", "float32"),
    *_pair("cpu-merged-auto-bf16", "merged", 3, "ar,jetflow+lookup", "8,16,32,auto", "bfloat16"),
    # make results, beyond the paper: the causal head's own tree builders against DDTree (replayed), and
    # where its drafts are accepted (on and off the argmax spine, per depth and rank)
    Entry("cpu-replay-trees", ("replay", "--methods", TREE_METHODS, *COMMON, *REPLAY_DATASETS, "--widths", "7"),
          "results", 6),
    Entry("cpu-replay-stop", ("replay", "--methods", "jetflow-cal,jetflow-bp,jetflow-stop", "--datasets", "gsm8k,math500",
                              "--limit", "5", "--max-new-tokens", "256", "--budgets", "8,16,32,64,128,255"), "results", 6),
    Entry("cpu-diagnosis", ("diagnose", "--limit", str(TREES_LIMIT), "--max-new-tokens", "256", "--datasets",
                            "gsm8k,math500,humaneval,mt_bench"), "results", 6),
    # make results, beyond the paper: the path-conditioned correction (jetflow-pc) against the same builder
    # without it (jetflow-bp) and DDTree, and the diagnosis before/after it (GSM8K and held-out training prompts)
    Entry("cpu-replay-correction", ("replay", "--methods", CORRECTION_METHODS, *COMMON, *REPLAY_DATASETS), "results", 7),
    Entry("cpu-diagnosis-correction", ("diagnose", "--limit", str(TREES_LIMIT), "--max-new-tokens", "256", "--datasets",
                                       "gsm8k", "--heldout", "24"), "results", 7),
    Entry("cpu-correction-cost", ("correction-cost",), "correction-cost", 1),  # timed: run it with the machine to itself
    # make sampling, beyond the paper: decoded tau of the best causal-head method and DDTree, greedy and
    # sample-and-match at T = 0.7 and 1.0 (prompt i sampled with seed i), fp32 so greedy equals AR; tau only
    *(Entry(f"cpu-sampling-{label}", ("bench", "--methods", "ar,jetflow-pc,ddtree", "--budgets", "32", "--datasets",
                                      "gsm8k,math500", "--limit", "4", "--max-new-tokens", "128", "--dtype", "float32",
                                      "--temperature", t), "sampling", 1)
      for label, t in (("greedy", "0"), ("t0.7", "0.7"), ("t1.0", "1.0"))),
    # the corrected builder decoded against AR in the same run: bf16 for speed, fp32 for identity (the committed
    # rows: one process at a time on an otherwise paused machine)
    *_pair("cpu-pc-bf16", "results", 8, "ar,jetflow-pc,jetflow-pc+lookup", "8,16", "bfloat16"),
    *_pair("cpu-pc-fp32", "results", 9, "ar,jetflow-pc", "16", "float32"),
    Entry("cpu-replay-tau-merged", ("replay", "--methods", "jetflow+lookup,ddtree+lookup,jetflow-bp+lookup",
                                    *COMMON, *REPLAY_DATASETS), "merged", 4),
    # eager vs compiled vs llama.cpp (docs/compiled.md): its own settings (3 prompts, 64 tokens, 2 threads)
    Entry("cpu-compiled", ("speed",), "compiled", 1),
    # every backend (int8 and q4 eager and compiled) beside llama.cpp on the same GGUF (docs/speed.md): unseen
    # MATH-500 prompts, one process, 1 thread each (ggml's spinning barrier collapses at 2 threads on a shared 2-core
    # machine), the budget each backend's own verify-cost curve picks (int8/q4 verify with exact attention);
    # llama.cpp's own verify curve; the machine's copy bandwidth
    Entry("cpu-backends", ("speed", "--backends", "fp32,bf16,int8,q4,q4x8,int8-compiled,q4-compiled,q4x8-compiled", "--dataset",
                           "math500", "--skip", "100", "--limit", "4", "--max-new-tokens", "64", "--repeats", "1", "--threads", "1", "--budget", "auto",
                           "--methods", "jetflow-pc+lookup,jetflow+lookup"), "backends", 1),
    # the 4-bit backends (q4, q4x8), eager and compiled (the compiled lean forward), beside llama.cpp at the CLI's default
    # of 2 threads each, the budget the q4 curve picks at 1 thread (docs/speed.md): on an idle machine; ggml's barrier
    # needs the second core to itself
    Entry("cpu-backends-2t", ("speed", "--backends", "q4,q4-compiled,q4x8,q4x8-compiled", "--dataset", "math500", "--skip", "100", "--limit", "4",
                              "--max-new-tokens", "64", "--repeats", "1", "--threads", "2", "--budget", "3",
                              "--methods", "jetflow-pc+lookup"), "backends", 2),
    # the verify-cost curve per backend (fp32, bf16, int8, q4; eager and compiled), one 2-thread process, with the
    # auto budget each curve picks; evaluation.budget.auto_budget reads these rows on the same CPU (docs/compiled.md)
    Entry("cpu-verify-curve", ("verify-curve", "--repeats", "3", "--calibrate", "1", "--max-new-tokens", "32"),
          "verify-curve", 1),
    # training throughput, cached taps vs the online target forward (docs/scale.md): 1 thread, bf16 target
    Entry("cpu-train-throughput", ("throughput",), "throughput", 1),
    # tau against training data (docs/scale.md, issue 20): both heads from scratch on the first k of the 8 parts of the
    # full-pool regeneration, replayed; resumable, and rerun as parts arrive (one point's heads ~8 min per part-pass)
    Entry("cpu-tau-curve", ("curve",), "curve", 1),
    # the same steps as the k = 4 point spent on all the data once (docs/scale.md): the causal head at k = 8 for one pass
    Entry("cpu-curve-one-pass", ("curve", "--parts", "8", "--heads", "causal", "--passes", "1"), "curve-one-pass", 1),
    # the path correction trained beside the largest replayed curve point's causal head (`make curve-correction`
    # trains it first, from the cached taps), replayed against the same point's bidirectional head under DDTree
    Entry("cpu-curve-correction", ("replay", "--methods", CORRECTION_METHODS, *COMMON, "--datasets",
                                   "gsm8k,math500,humaneval,mt_bench", "--budgets", "16,64,255",
                                   "--jetflow-head", curve_head("causal"), "--dflash-head", curve_head("bidirectional")),
          "curve-correction", 1),
    # the one-pass head (data/heads/smollm2-135m-jetflow-pool1) with its own path correction (`make pool1-correction`
    # trains it first), replayed as cpu-curve-correction (its DDTree: that table's, the k = 4 bidirectional head of
    # the same steps), then decoded against AR in fp32, the fast dtype of a CPU without AVX-512 BF16 or AMX
    Entry("cpu-pool1-correction", ("replay", "--methods", "jetflow-pc,jetflow-bp", *COMMON, "--datasets",
                                   "gsm8k,math500,humaneval,mt_bench", "--budgets", "16,64,255",
                                   "--jetflow-head", POOL1_HEAD), "pool1-correction", 1),
    # timed: run each alone (the committed rows: one after the other in one session, nothing else running)
    *_pair("cpu-pool1-fp32", "pool1-speed", 1, "ar,jetflow-pc,jetflow-pc+lookup", "8", "float32",
           "--jetflow-head", POOL1_HEAD),
    # the same head at budgets 8, 16 and 24 in one run, for a CPU without AVX-512 (AVX2 only), where a 17-token
    # fp32 verify was measured at about the cost of a 9-token one (`python -m jetflow cost --dtype float32`);
    # timed, each alone (`make pool1-budget`)
    *_pair("cpu-pool1-fp32-budget", "pool1-budget", 1, "ar,jetflow-pc,jetflow-pc+lookup", "8,16,24", "float32",
           "--jetflow-head", POOL1_HEAD),
    # continuation after an accepted sibling (issue 41): math, code and chat prompts 21-30, which no method choice
    # of the kit was tuned on and no head trained on, replayed at budgets 16 and 64 (`make sibling`): DFlash and
    # DDTree with the shipped bidirectional head against the causal heads, the whole-pool one with its path
    # correction and the shipped one with its own
    *(Entry(name, ("replay", "--methods", SIBLING_METHODS, *SIBLING_PROMPTS, *extra), "sibling", 1)
      for name, extra in (("cpu-sibling-pool1", ("--jetflow-head", POOL1_HEAD)), ("cpu-sibling-shipped", ()))),
    # the corrections beside the path one (issue 41), each trained on top of the whole-pool head's path correction
    # from the features of `train-correction --max-seqs 192 --spread` (data/heads/<head>-pcb, -pcs): the same
    # held-out prompts as cpu-sibling-pool1 (`make corrections`)
    *(Entry(f"cpu-corrections-{v}", ("replay", "--methods", f"jetflow-{v}", *SIBLING_PROMPTS, "--jetflow-head",
                                       POOL1_HEAD), "corrections", 1) for v in ("pc", "pcb", "pcs")),
)}
GROUPS = tuple(dict.fromkeys(e.group for e in ENTRIES.values()))


def entry(name: str) -> Entry:
    if name not in ENTRIES:
        raise ValueError(f"unknown result {name!r}; choose from {', '.join(ENTRIES)}")
    return ENTRIES[name]


def command(name: str, results: Path = RESULTS) -> list[str]:
    """The ``python -m jetflow`` arguments that reproduce ``data/results/NAME``."""
    return [*entry(name).argv, "--out", str(Path(results) / name)]


def batches(group: str) -> list[list[str]]:
    """The entry names of a group, batch by batch."""
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; choose from {', '.join(GROUPS)}")
    order: dict[int, list[str]] = {}
    for e in ENTRIES.values():
        if e.group == group:
            order.setdefault(e.batch, []).append(e.name)
    return [order[b] for b in sorted(order)]


def render(name: str, results: Path = RESULTS) -> Path:
    """Rewrite ``NAME/table.md`` from its committed ``rows.json`` with the entry's renderer."""
    folder = Path(results) / name
    rows = json.loads((folder / "rows.json").read_text())
    (folder / "table.md").write_text(entry(name).renderer(rows))
    return folder / "table.md"
