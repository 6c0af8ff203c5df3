"""Replayed tau against training data: the causal and the bidirectional head trained from scratch on
the first k of a chunked regeneration's parts, each replayed on the benchmarks (``python -m jetflow curve``).

    rows = run(CurveConfig(data="~/.cache/jetflow/regen-smollm2-135m-bfloat16-all-256", out="data/results/x"))
    to_markdown(rows)       # tau per head method, dataset and k at each budget, with the response tokens seen

One recipe for every point, so that the data size is the only thing that changes: the cpu preset with the
shipped heads' settings (loss ce, cached taps, 64 anchors, 2 sequences per step, a draft vocabulary of
8192, the depth curriculum from gamma 0.5 to 4 for the causal head and to 7 for the bidirectional one),
from scratch (the target's embedding-initialised head), for the same number of passes over the training
sequences: ``steps = ceil(passes * sequences / seqs_per_step)``, so the response tokens seen scale with k.
Each point is a head directory under ``work`` (``{head}-k{k}``, resumable: training resumes from its
checkpoint) and its replay rows (``replay.json``, reused while the training command and the replay
settings are the same); a point whose parts are still being
regenerated (no ``.meta.json`` beside a part yet) is skipped and the rest are written, so rerunning the same
command later adds the missing points. The taps of the parts a point needs are cached first (resumable).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from jetflow.data.regenerate import data_files, part_of
from jetflow.evaluation.rows import at_budget, write_rows
from jetflow.util.paths import cache_dir, portable_path
from jetflow.util.flags import comma_list, option

HEADS = {  # head kind -> (TrainConfig fields, the replayed methods)
    "causal": ({"causal": True, "gamma": 4.0}, ("jetflow", "jetflow-bp")),
    "bidirectional": ({"causal": False, "gamma": 7.0}, ("ddtree", "dflash")),
}
DEFAULT_DATA = "regen-smollm2-135m-bfloat16-all-256"  # `regenerate --n 0 --chunks 8 --max-new-tokens 256`
DEFAULT_PASSES = 2.0  # CurveConfig.passes: a point trained for other passes gets a folder of its own
PLOT = "curve.html"
TAPS_MAX_LEN = 768  # what `python -m jetflow taps` caches by default: a cache built by hand is reused


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in comma_list(text))


@dataclass(frozen=True)
class CurveConfig:
    out: str = option("", "results folder: rows.json, table.md and curve.html", required=True)
    data: str | None = option(None, "the chunked regeneration (regenerate --chunks K; default: the jetflow "
                              f"cache's {DEFAULT_DATA}); its parts 0..k-1 are the data of point k",
                              parse=lambda text: str(Path(text).expanduser().resolve()))
    work: str | None = option(None, "folder of the points' heads and replay rows (default: the jetflow "
                              "cache's curve/DATA)")
    parts: tuple[int, ...] = option((1, 2, 4, 8), "the k of each point, comma list", parse=_ints)
    heads: tuple[str, ...] = option(tuple(HEADS), "head kinds, comma list: " + ",".join(HEADS), parse=comma_list)
    passes: float = option(DEFAULT_PASSES, "passes over each point's training sequences (the same for every k)")
    anchors: int = option(64, "anchors per sequence (the shipped heads' recipe)")
    seqs_per_step: int = option(2, "sequences per optimiser step (the shipped heads' recipe)")
    lr: float = option(1e-3, "peak AdamW lr (the cpu preset's)")
    draft_vocab: int = option(8192, "draft vocabulary (the shipped heads')")
    max_len: int = option(512, "truncate prompt + response (the cpu preset's; the taps are cached at 768)")
    datasets: tuple[str, ...] = option(("gsm8k", "math500", "humaneval", "mt_bench"), "replayed datasets, "
                                       "comma list", parse=comma_list)
    limit: int = option(20, "first N prompts of each dataset")
    max_new_tokens: int = option(256, "new tokens of each AR answer")
    budgets: tuple[int, ...] = option((16, 64, 255), "replayed budgets, comma list", parse=_ints)
    data_dir: str | None = option(None, "offline data folder of the benchmarks (default: $JETFLOW_DATA_DIR, else the hub)")
    seed: int = option(0, "training seed of every point")
    holdout: int = option(48, "rows of the regeneration's last part that no point trains on (train --holdout): "
                          "the acceptance profile's prompts for the heads of the point that reaches that part")
    done_only: bool = option(False, "write the rows of the points whose heads are all trained and replayed "
                             "already (replay.json), and skip the others: nothing is trained or replayed, so "
                             "the committed rows can be refreshed while a larger point is still training",
                             negate=("--train-missing", "train and replay the points still missing (the default)"))
    keep: bool = option(False, "keep the rows already in --out of the points (head, k) not run now, each with its own "
                        "training command: a larger point can be added to the committed rows without the smaller "
                        "points' heads on this machine (their replay settings must be this run's)",
                        negate=("--replace", "write only the points run now (the default)"))

    prompts_file = None  # ``bench.prompt_sets`` reads the benchmark prompts of this config

    def __post_init__(self):
        if self.data is None:
            object.__setattr__(self, "data", str(cache_dir() / DEFAULT_DATA))
        bad = [h for h in self.heads if h not in HEADS]
        if bad or not self.heads:
            raise ValueError(f"unknown head kind(s) {bad}; choose from {', '.join(HEADS)}")
        if not self.parts or min(self.parts) < 1 or self.passes <= 0 or min(self.anchors, self.seqs_per_step) < 1:
            raise ValueError("need parts >= 1, passes > 0, anchors >= 1 and seqs_per_step >= 1, got "
                             f"{list(self.parts)}, {self.passes}, {self.anchors}, {self.seqs_per_step}")

    @property
    def work_dir(self) -> Path:
        return Path(self.work) if self.work else cache_dir() / "curve" / Path(self.data).name


def ready(data: str | Path, k: int) -> bool:
    """Whether parts 0..k-1 of the chunked folder are whole: ``regenerate`` writes a part's ``.meta.json``
    once its last answer is in."""
    files = sorted(Path(data).glob("part-*-of-*.jsonl"))
    return len(files) >= k and all(f.with_name(f.name + ".meta.json").is_file() for f in files[:k])


def train_config(cfg: CurveConfig, k: int, head: str, taps_dir: Path):
    """The point's TrainConfig: the one recipe, its data (the first k parts) and its step count; the point
    that reaches the last part holds ``cfg.holdout`` of its rows out (the other points never see that part)."""
    from jetflow.training.train import split_data
    from jetflow.training.config import TrainConfig
    last = k >= part_of(data_files(cfg.data)[0])[1]  # k reaches part N-1 of N
    base = TrainConfig.from_name("cpu", data=cfg.data, parts=k, taps="cached", taps_dir=str(taps_dir), loss="ce",
                                 holdout=cfg.holdout if last else 0,
                                 out=str(point_dir(cfg, k, head)), gamma_start=0.5, anchors_per_seq=cfg.anchors,
                                 seqs_per_step=cfg.seqs_per_step, lr=cfg.lr, draft_vocab=cfg.draft_vocab,
                                 max_len=cfg.max_len, seed=cfg.seed, **HEADS[head][0])
    steps = max(1, math.ceil(cfg.passes * len(split_data(base).indexed) / cfg.seqs_per_step))
    return replace(base, steps=steps, eval_every=max(1, steps // 4), save_every=min(200, steps))


def point_dir(cfg: CurveConfig, k: int, head: str) -> Path:
    """``{head}-k{k}``, with ``-p{passes}`` when the passes are not the default: a point trained for other passes
    is another head, so it never meets the default point's checkpoint."""
    return cfg.work_dir / (f"{head}-k{k}" + ("" if cfg.passes == DEFAULT_PASSES else f"-p{cfg.passes:g}"))


def point_config(cfg: CurveConfig, k: int, head: str, target):
    """``train_config`` with the default taps folder of ``target`` (where ``train_point`` caches them)."""
    from jetflow.training.taps import default_dir
    return train_config(cfg, k, head, default_dir(cfg.data, target.name, _layers(target)))


def train_point(cfg: CurveConfig, k: int, head: str, target, *, progress: bool = True):
    """Cache the taps of the point's parts, then train (or resume) its head, unless its replay rows are saved
    already. Every process of an ``accelerate launch`` calls this for the same points, in the same order, so
    they train each head together (docs/distributed.md). -> the point's TrainConfig."""
    from jetflow.training.taps import build_all, cache_for, default_dir
    from jetflow.training.train import train
    layers = _layers(target)
    root = default_dir(cfg.data, target.name, layers)
    tcfg = train_config(cfg, k, head, root)
    if saved_rows(cfg, tcfg) is None:
        files = data_files(cfg.data, k)
        build_all(target, files, [cache_for(root, f, True) for f in files], layers=layers, max_len=TAPS_MAX_LEN,
                  progress=progress, wait=True)  # one head per process side by side: one builds, the other waits
        train(tcfg, target, progress=progress)
    return tcfg


def point(cfg: CurveConfig, k: int, head: str, target, fp32_target, traces, *, progress: bool = True) -> list[dict]:
    """One point's replay rows: the saved ones (``replay.json``), or its trained head (``train_point``) replayed
    once and saved. -> its rows."""
    from jetflow.evaluation.replay import replay
    tcfg = point_config(cfg, k, head, target)
    out = Path(tcfg.out)
    rows = saved_rows(cfg, tcfg)
    if rows is not None:
        return rows
    if not (out / "provenance.json").is_file():
        raise RuntimeError(f"the head of {head} k = {k} is not trained yet ({out}); curve.train_point trains it")
    prov = json.loads((out / "provenance.json").read_text())
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    last = history[-1]
    kind = "jetflow" if tcfg.causal else "dflash"
    rows = replay(fp32_target, HEADS[head][1], traces, cfg.budgets, heads={kind: str(out)}, progress=progress)
    extra = {"head": head, "parts": k,
             "train_sequences": prov["data"]["train_sequences"], "steps": tcfg.steps, "passes": cfg.passes,
             "response_tokens_seen": prov["tokens"]["response_tokens"],
             "supervised_slots": prov["tokens"]["supervised_slots"], "heldout_sim_tau": last["sim_tau"],
             "heldout_acc1": last["acc"][0], "train_command": prov["command"], "max_new_tokens": cfg.max_new_tokens}
    rows = [r | extra for r in rows]
    (out / "replay.json").write_text(json.dumps(rows, indent=1) + "\n")
    return rows


def saved_rows(cfg: CurveConfig, tcfg) -> list[dict] | None:
    """The point's saved replay rows (``replay.json``) if they answer this config: the same training
    command and every asked (dataset, budget); else None (the point is still to train or to replay)."""
    from jetflow.training.config import command_for
    saved = Path(tcfg.out) / "replay.json"
    if not saved.is_file():
        return None
    rows = json.loads(saved.read_text())
    asked = {(d, b) for d in cfg.datasets for b in cfg.budgets}
    if all(_same_settings(r, cfg, command_for(tcfg)) for r in rows) and \
            {(r["dataset"], r["budget"]) for r in rows} == asked:
        return rows
    return None


def _same_settings(row: dict, cfg: CurveConfig, command: str) -> bool:
    """Whether a saved replay row answers this config: the same training command and replay settings
    (otherwise the point is replayed again; training itself refuses a checkpoint of another config)."""
    return (row.get("train_command") == command and row.get("max_new_tokens") == cfg.max_new_tokens
            and row["n_prompts"] == cfg.limit and row["dataset"] in cfg.datasets and row["budget"] in cfg.budgets)


def _is_main() -> bool:
    """Whether this process writes the rows: the only one, or the main one of an ``accelerate launch``."""
    from jetflow.training.train import is_main_process
    return is_main_process()


def _layers(target) -> tuple[int, ...]:
    from jetflow.drafting.head import HeadConfig
    return HeadConfig.for_target(target.config).target_layer_ids  # TrainConfig's 2 draft layers


def run(cfg: CurveConfig, target=None, fp32_target=None, *, progress: bool = True) -> list[dict]:
    """Every ready point (k ascending, each head), then rows.json, table.md and the plot in ``out``."""
    from jetflow.util import checks
    from jetflow.evaluation.bench import prompt_sets
    from jetflow.evaluation.replay import ar_traces, trace_cache
    from jetflow.engine.load import load_target
    todo = [k for k in sorted(set(cfg.parts)) if ready(cfg.data, k)]
    skipped = sorted(set(cfg.parts) - set(todo))
    if not todo:
        raise ValueError(f"no point is ready: parts 0..{min(cfg.parts) - 1} of {cfg.data} are not all whole yet "
                         "(python -m jetflow regenerate --chunks K writes them; python -m jetflow unpack --packed "
                         f"data/regen/{DEFAULT_DATA} --out {cfg.data} restores the parts the kit ships)")
    checks.writable_dir(cfg.out, "--out")
    target = target or load_target(None, dtype="bfloat16")   # the cached taps' dtype
    if cfg.done_only:
        done = [k for k in todo if all(saved_rows(cfg, point_config(cfg, k, h, target)) is not None for h in cfg.heads)]
        skipped, todo = sorted(set(skipped) | set(todo) - set(done)), done
        if not todo:
            raise ValueError("--done-only: no point has all its heads trained and replayed yet")
    kept = kept_rows(cfg, {(h, k) for k in todo for h in cfg.heads}) if cfg.keep else []  # refused before any work
    for k in todo:  # every point trained first: under `accelerate launch` all processes train, the main one replays
        for head in cfg.heads:
            train_point(cfg, k, head, target, progress=progress and _is_main())
    if not _is_main():
        return []  # a data-parallel peer: the main process replays the points and writes the rows
    fp32_target = fp32_target or load_target(None, dtype="float32")  # replay: fp32, as the committed tau
    prompts = checks.prompt_source(lambda: prompt_sets(cfg))
    traces = {ds: ar_traces(fp32_target, ps, cfg.max_new_tokens, dataset=ds, progress=progress,
                            cache=trace_cache(fp32_target, ds))
              for ds, ps in prompts.items()}
    of_parts = part_of(data_files(cfg.data)[0])[1]  # N of part-KK-of-NN, however many exist yet
    settings = {f: v for f, v in asdict(cfg).items() if f not in ("done_only", "keep")}  # how it ran, not what it measured
    rows = [r | {"of_parts": of_parts, "curve": settings | {"data": portable_path(cfg.data), "out": Path(cfg.out).name,
                                          "work": None if cfg.work is None else portable_path(cfg.work)}}
            for k in todo for head in cfg.heads
            for r in point(cfg, k, head, target, fp32_target, traces, progress=progress)]
    if kept:
        rows = kept + rows
        rows.sort(key=lambda r: (r["parts"], list(HEADS).index(r["head"])))  # stable: a point's rows stay in order
    write_rows(rows, cfg.out, to_markdown)
    plot(rows).write_html(Path(cfg.out) / PLOT, include_plotlyjs="cdn")
    if skipped:
        why = "not trained and replayed yet (--done-only)" if cfg.done_only else "their parts are still being regenerated"
        print(f"skipped k = {skipped}: {why}; rerun to add them", flush=True)
    return rows


def kept_rows(cfg: CurveConfig, ran: set[tuple[str, int]]) -> list[dict]:
    """``--keep``: the rows in ``cfg.out``'s rows.json of the points (head, k) not in ``ran``. Each keeps its own
    training command and curve settings; a kept row replayed on other prompts, tokens, datasets or budgets
    than this run is refused, since the table would mix them."""
    saved = Path(cfg.out) / "rows.json"
    if not saved.is_file():
        return []
    kept = [r for r in json.loads(saved.read_text()) if (r["head"], r["parts"]) not in ran]
    asked = {(d, b) for d in cfg.datasets for b in cfg.budgets}
    for r in kept:
        if r["n_prompts"] != cfg.limit or r.get("max_new_tokens") != cfg.max_new_tokens or \
                (r["dataset"], r["budget"]) not in asked:
            raise ValueError(f"--keep: the kept row of {r['head']} k = {r['parts']} ({r['dataset']}, budget {r['budget']}, "
                             f"{r['n_prompts']} prompts, {r.get('max_new_tokens')} new tokens) was replayed with other "
                             f"settings than this run; rerun that point or drop --keep")
    return kept


def table(rows: list[dict]) -> str:
    """One line per head method, dataset and k: response tokens seen, held-out depth-1 accuracy, tau per budget;
    then the recipe (docs/scale.md shows this)."""
    budgets = sorted({r["budget"] for r in rows})
    lines = ["| method | dataset | parts | response tokens seen | held-out acc1 | "
             + " | ".join(f"B={b}" for b in budgets) + " |", "|---|---|---|---|---|" + "---|" * len(budgets)]
    cells: dict[tuple, dict] = {}
    for r in rows:
        cells.setdefault((r["method"], r["dataset"], r["parts"], r["of_parts"], r["response_tokens_seen"],
                          r["heldout_acc1"]), {})[r["budget"]] = r["tau"]
    for (method, ds, k, of, seen, acc1), taus in sorted(cells.items(), key=lambda c: (c[0][0], c[0][1], c[0][2])):
        lines.append(f"| {method} | {ds} | {k}/{of} | {seen:,} | {acc1:.3f} | "
                     + " | ".join(f"{taus[b]:.2f}" if b in taus else "" for b in budgets) + " |")
    c = rows[0]["curve"]
    lines += ["", f"Each head trained from scratch on the first k parts, {c['passes']:g} passes over its training "
              f"sequences (steps = passes x sequences / {c['seqs_per_step']}), {c['anchors']} anchors per sequence, "
              f"loss ce, cached taps, draft vocabulary {c['draft_vocab']}, seed {c['seed']}; replayed greedy tau "
              f"(fp32) on the first {c['limit']} prompts, {c['max_new_tokens']} new tokens. "
              "Command: python -m jetflow curve (jetflow/results/curve.py)."]
    if len({r["parts"] for r in rows}) > 1:
        budget = budgets[len(budgets) // 2]
        lines += ["", f"Tau gained per doubling of the response tokens seen, at budget {budget}, between consecutive "
                  "points (the curve bends where this falls):", "", gains_table(rows, budget)]
    return "\n".join(lines)


def same_steps_table(rows: list[dict], other: list[dict]) -> str:
    """The same optimiser steps spent two ways: each point of ``other`` (trained for other passes, say one pass
    over all the parts) beside the point of ``rows`` of the same head whose step count is nearest (two passes
    over half the parts), per head method, dataset and budget (docs/scale.md)."""
    budgets = sorted({r["budget"] for r in other})
    lines = ["| method | dataset | " + " | ".join(f"B={b}" for b in budgets) + " |", "|---|---|" + "---|" * len(budgets)]
    pairs = []
    for head, k in dict.fromkeys((r["head"], r["parts"]) for r in other):
        mine = [r for r in other if (r["head"], r["parts"]) == (head, k)]
        theirs = [r for r in rows if r["head"] == head]
        if not theirs:
            raise ValueError(f"no {head} point to set beside the {head} k = {k} point")
        near = min({r["parts"] for r in theirs}, key=lambda j: abs(next(r["steps"] for r in theirs if r["parts"] == j)
                                                                   - mine[0]["steps"]))
        base = [r for r in theirs if r["parts"] == near]
        pairs.append((base[0], mine[0]))
        tau = {(r["method"], r["dataset"], r["budget"]): r["tau"] for r in base}
        for method, ds in dict.fromkeys((r["method"], r["dataset"]) for r in mine):
            cells = []
            for b in budgets:
                new = next((r["tau"] for r in mine if (r["method"], r["dataset"], r["budget"]) == (method, ds, b)), None)
                old = tau.get((method, ds, b))
                cells.append("" if new is None or old is None else f"{old:.2f} -> {new:.2f} ({(new / old - 1) * 100:+.1f} %)")
            lines.append(f"| {method} | {ds} | " + " | ".join(cells) + " |")
    notes = [f"{a['head']} head: k = {a['parts']}/{a['of_parts']} for {a['passes']:g} passes ({a['steps']:,} steps, "
             f"{a['response_tokens_seen']:,} response tokens seen, held-out acc1 {a['heldout_acc1']:.3f}) -> "
             f"k = {b['parts']}/{b['of_parts']} for {b['passes']:g} pass{'es' if b['passes'] != 1 else ''} "
             f"({b['steps']:,} steps, {b['response_tokens_seen']:,} response tokens seen, held-out acc1 "
             f"{b['heldout_acc1']:.3f})" for a, b in pairs]
    return "\n".join(lines + [""] + notes + ["", "Replayed greedy tau (fp32), the first "
                                              f"{other[0]['n_prompts']} prompts of each dataset; the rest of the "
                                              "recipe is the curve's."])


def gains(rows: list[dict], budget: int) -> list[dict]:
    """Per head method and dataset, between each two consecutive points k_a < k_b: the tau gained at ``budget``
    per doubling of the response tokens seen, (tau_b - tau_a) / log2(seen_b / seen_a)."""
    picked = at_budget(rows, budget)
    out = []
    for method, ds in dict.fromkeys((r["method"], r["dataset"]) for r in picked):
        pts = sorted((r for r in picked if (r["method"], r["dataset"]) == (method, ds)), key=lambda r: r["parts"])
        out += [{"method": method, "dataset": ds, "from": a["parts"], "to": b["parts"], "budget": budget,
                 "per_doubling": (b["tau"] - a["tau"]) / math.log2(b["response_tokens_seen"] / a["response_tokens_seen"])}
                for a, b in zip(pts, pts[1:])]
    return out


def gains_table(rows: list[dict], budget: int) -> str:
    """``gains`` as a table: one line per head method and dataset, a column per pair of consecutive points."""
    g = gains(rows, budget)
    pairs = sorted({(r["from"], r["to"]) for r in g})
    lines = ["| method | dataset | " + " | ".join(f"k {a} -> {b}" for a, b in pairs) + " |",
             "|---|---|" + "---|" * len(pairs)]
    keys = dict.fromkeys((r["method"], r["dataset"]) for r in g)
    for method, ds in sorted(keys, key=lambda key: key[0]):  # by method, the datasets in their order
        cells = {(r["from"], r["to"]): r["per_doubling"] for r in g if (r["method"], r["dataset"]) == (method, ds)}
        lines.append(f"| {method} | {ds} | " + " | ".join(f"{cells[p]:+.2f}" if p in cells else "" for p in pairs) + " |")
    return "\n".join(lines)


def to_markdown(rows: list[dict]) -> str:
    """The results folder's table.md."""
    return f"# Replayed tau against training data\n\n{table(rows)}\n"


def summary(rows: list[dict], budget: int) -> list[str]:
    """One line per head method and k: the response tokens seen and the replayed tau on each dataset at ``budget``
    (notebook 02 prints these)."""
    picked = at_budget(rows, budget)
    lines = []
    for method in dict.fromkeys(r["method"] for r in picked):
        for k in sorted({r["parts"] for r in picked if r["method"] == method}):
            point = [r for r in picked if r["method"] == method and r["parts"] == k]
            taus = ", ".join(f"{r['dataset']} {r['tau']:.2f}" for r in point)
            lines.append(f"{method:10s} k = {k}/{point[0]['of_parts']}, {point[0]['response_tokens_seen']:>10,} response "
                         f"tokens seen: tau at budget {budget}: {taus}")
    return lines


def plot(rows: list[dict], budget: int | None = None):
    """Tau at ``budget`` (default: the middle one) against the response tokens seen (log x), one panel per
    dataset, one line per head method (``viz_train.data_curve``)."""
    from jetflow.views.viz_train import data_curve
    budgets = sorted({r["budget"] for r in rows})
    return data_curve(rows, budget if budget is not None else budgets[len(budgets) // 2])
