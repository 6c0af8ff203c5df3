"""Training throughput: supervised slots per second with cached taps against the online target forward,
the same head, data and batch settings, timed in one run (``python -m jetflow throughput``).

    rows = measure(ThroughputConfig(out="data/results/cpu-train-throughput"))
    to_markdown(rows)   # one row per taps source, its slots/s and the ratio cached / online

The data is made on the spot: the target regenerates ``prompts`` training prompts (resumable, in the jetflow
cache) and their taps are cached (``jetflow.training.taps``); neither is timed. Then both sources train their own
copy of the same fresh head (same seed), ``steps`` optimiser steps each after one untimed warm-up step,
interleaved in ``rounds`` blocks so that both share every stretch of machine load. The head's step is
the training default (``TrainConfig.precision`` and ``attention``, auto: bf16 and blockwise on a CPU
with native bf16); with ``reference`` cached taps are also timed under the fp32 packed step that
training used before, so the table shows what each part of the step's speed-up comes from.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from jetflow.util.flags import comma_list, option

SOURCES = ("online", "cached")
REFERENCE = {"precision": "float32", "attention": "packed"}  # the head step before bf16 and blockwise attention


@dataclass(frozen=True)
class ThroughputConfig:
    out: str = option("", "folder for rows.json and table.md", required=True)
    prompts: int = option(16, "training prompts the target answers for the measurement (cached, not timed)")
    max_new_tokens: int = option(256, "new tokens per answer (what the benchmarks decode)")
    steps: int = option(30, "timed optimiser steps per taps source and anchors")
    rounds: int = option(3, "interleaved blocks of steps/rounds steps per run")
    anchors: tuple[int, ...] = option((64, 32, 16), "anchors per sequence, comma list: each is measured with "
                                      "both sources (64: the shipped heads' recipe)",
                                      parse=lambda text: tuple(int(a) for a in comma_list(text)))
    seqs_per_step: int = option(2, "sequences per step (the shipped heads' recipe)")
    draft_vocab: int = option(8192, "draft vocabulary (the shipped heads' recipe; 0: the whole vocabulary)")
    max_len: int = option(512, "truncate prompt + response (the cpu preset)")
    dtype: str = option("bfloat16", "the target's dtype")
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")
    reference: bool = option(True, "also time cached taps under the fp32 packed head step (the step before "
                             "bf16 autocast and blockwise attention)", negate=("--no-reference", "skip it"))


def _work(cfg: ThroughputConfig, target) -> Path:
    from jetflow.util.paths import cache_dir
    return cache_dir() / "throughput" / f"{target.name.replace('/', '--')}-{cfg.dtype}-{cfg.prompts}-{cfg.max_new_tokens}"


def prepare(cfg: ThroughputConfig, target) -> tuple[Path, Path, str]:
    """Regenerate the prompts and cache their taps (both resume). -> (data file, taps folder, prompt source)."""
    from jetflow.data.prompts import training_prompts
    from jetflow.data.regenerate import regenerate
    from jetflow.util.paths import data_dir, source_name
    from jetflow.drafting.head import HeadConfig
    from jetflow.training.taps import build
    work = _work(cfg, target)
    work.mkdir(parents=True, exist_ok=True)
    prompts = training_prompts(cfg.prompts, data_dir=cfg.data_dir)
    data = regenerate(target, prompts, work / "regen.jsonl", max_new_tokens=cfg.max_new_tokens,
                      settings={"n": cfg.prompts, "seed": 0})
    layers = HeadConfig.for_target(target.config).target_layer_ids  # TrainConfig's 2 draft layers
    return data, build(target, data, layers=layers, max_len=cfg.max_len, out=work / "taps"), \
        source_name(data_dir(cfg.data_dir))


def _run(cfg: ThroughputConfig, target, data: Path, taps: Path, anchors: int, source: str, step: str):
    """A training run (not started) of the cpu preset with the shipped heads' loss and these settings;
    ``step`` "default" (the training default head step) or "reference" (``REFERENCE``)."""
    from jetflow.training.train import setup
    from jetflow.training.config import TrainConfig
    out = _work(cfg, target) / f"run-{source}-{anchors}-{step}"
    return setup(TrainConfig.from_name(
        "cpu", data=str(data), out=str(out), loss="ce", anchors_per_seq=anchors, seqs_per_step=cfg.seqs_per_step,
        draft_vocab=cfg.draft_vocab, max_len=cfg.max_len, dtype=cfg.dtype, eval_seqs=1, steps=cfg.steps + 1,
        taps=source, taps_dir=str(taps), **(REFERENCE if step == "reference" else {})), target)[0]


def head_step(run) -> str:
    """The head step a run takes, as its table names it: "bfloat16 blockwise", "float32 packed", ..."""
    from jetflow.training.step import head_compute
    dtype, blockwise = head_compute(run.cfg, run.accelerator.device)
    return f"{str(dtype).removeprefix('torch.')} {'blockwise' if blockwise else 'packed'}"


def measure(cfg: ThroughputConfig, target=None, *, progress: bool = True) -> list[dict]:
    """One row per (anchors, taps source, head step): steps, seconds, supervised slots, slots/s and the
    ratio of its slots/s to the online source's (default head step) at the same anchors."""
    from tqdm.auto import tqdm
    from jetflow.util.hardware import environment
    from jetflow.engine.load import load_target
    from jetflow.training.step import train_step
    if cfg.steps < cfg.rounds or cfg.rounds < 1 or not cfg.anchors:
        raise ValueError(f"need steps >= rounds >= 1 and some anchors, got steps={cfg.steps}, rounds={cfg.rounds}")
    target = target or load_target(None, dtype=cfg.dtype)
    data, taps, source = prepare(cfg, target)
    keys = [(a, s, "default") for a in cfg.anchors for s in SOURCES]
    keys += [(a, "cached", "reference") for a in cfg.anchors] if cfg.reference else []
    runs = {k: _run(cfg, target, data, taps, *k) for k in keys}
    totals = {k: {"steps": 0, "seconds": 0.0, "supervised_slots": 0, "response_tokens": 0} for k in keys}
    for run in runs.values():  # warm-up step (allocations, first-call overheads): not timed
        train_step(run, 0)
    per_round = cfg.steps // cfg.rounds
    bar = tqdm(total=len(keys) * per_round * cfg.rounds, desc="throughput", unit="step", disable=not progress)
    for r in range(cfg.rounds):
        for k in keys:  # the same data positions for every run: the same sequences
            t = totals[k]
            for i in range(per_round):
                position = (1 + r * per_round + i) * cfg.seqs_per_step
                start = time.perf_counter()
                _, counts = train_step(runs[k], position)
                t["seconds"] += time.perf_counter() - start
                t["steps"] += 1
                t["supervised_slots"] += counts["supervised_slots"]
                t["response_tokens"] += counts["response_tokens"]
                bar.update(1)
    bar.close()
    env = environment(target) | {"threads": torch.get_num_threads()}  # hardware: the CPU and its bf16 support
    rows = [{"taps": s, "anchors": a, "head_step": head_step(runs[a, s, step]), "reference": step == "reference",
             **t, "slots_per_s": t["supervised_slots"] / t["seconds"], "s_per_step": t["seconds"] / t["steps"],
             "config": asdict(cfg) | {"out": Path(cfg.out).name}, "prompt_source": source, **env}
            for (a, s, step), t in totals.items()]
    online = {r["anchors"]: r["slots_per_s"] for r in rows if r["taps"] == "online" and not r["reference"]}
    return [r | {"ratio_to_online": r["slots_per_s"] / online[r["anchors"]]} for r in rows]


def table(rows: list[dict]) -> str:
    """Per anchors and taps source: seconds per step, supervised slots per second, ratio to online;
    then the settings and the hardware line."""
    c, r0 = rows[0]["config"], rows[0]
    lines = ["| anchors | taps | head step | steps | s / step | supervised slots / s | vs online |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['anchors']} | {r['taps']} | {r.get('head_step', 'float32 packed')} | {r['steps']} | "
              f"{r['s_per_step']:.2f} | {r['slots_per_s']:.0f} | {r['ratio_to_online']:.2f}x |"
              for r in sorted(rows, key=lambda r: (-r["anchors"], SOURCES.index(r["taps"]), r.get("reference", False)))]
    lines += ["", f"{c['prompts']} regenerated answers ({c['max_new_tokens']} new tokens, max_len {c['max_len']}), "
              f"{c['seqs_per_step']} sequences per step, loss ce, draft vocabulary {c['draft_vocab'] or 'all'}, fp32 "
              f"head weights and AdamW, {r0['dtype']} target, {r0['threads']} thread(s); {c['steps']} timed steps "
              f"per row in {c['rounds']} interleaved rounds. Head step: the compute dtype of the head's matmuls and "
              f"its attention layout (jetflow.drafting.blockwise). {r0['hardware']}; torch {r0['torch']}."]
    return "\n".join(lines)


def to_markdown(rows: list[dict]) -> str:
    """The folder's table.md."""
    return f"# Training throughput: cached taps vs the online target\n\n{table(rows)}\n"
