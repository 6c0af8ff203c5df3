"""The verify-cost curve per backend (issue 40, deliverable 3): what a verify of k tokens costs on this CPU for
every backend of the embedded target (fp32, bf16, int8, q4), eager and compiled, in one process.

    python -m jetflow verify-curve                      # all backends, eager and compiled; saved for auto_budget
    python -m jetflow results cpu-verify-curve          # the committed run (data/results/cpu-verify-curve)

Each backend's verify step (forward, accept, compaction: ``evaluation.budget.time_verify_step``) runs over a
cache of ``past_len`` random tokens for every k in ``sizes``; backends and sizes interleave inside every
repeat, so a shared machine's load hits them alike, and the median over repeats is kept. A compiled backend
runs a k-token tree at its padded query size (``CompileConfig.padded``), as a decode does; its graphs compile
(or load from inductor's cache) in an untimed first sweep whose seconds land in ``compile_s``. Beside each
curve, the budget ``evaluation.budget.pick_budget`` picks from it, with tau and draft seconds calibrated once
per dtype and quantization (eager, ``method`` on the first ``calibrate`` MATH-500 prompts): the same tau against
each backend's own curve, so the chosen budget moves with the backend. ``auto_budget`` reads these rows
(``saved_cost``) instead of timing a curve of its own where the backend, model, CPU and thread count match.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from jetflow.data.prompts import load_prompts
from jetflow.engine.load import BACKENDS, backend_of, load_backend
from jetflow.evaluation.budget import calibrate, curve_files, forward_of, pick_budget, random_tree, time_verify_step
from jetflow.evaluation.rows import write_rows
from jetflow.util import hardware
from jetflow.util.flags import comma_list, option

SIZES = (1, 2, 4, 8, 12, 16, 17, 24, 32, 33)  # verified tokens, root included (17 and 33: budgets 16 and 32)
PICK_BUDGETS = (4, 8, 12, 16, 23, 32)          # budgets the picker weighs: every tree fits the curve
CACHE_LEN = 512                                 # static cache of a compiled backend: past_len + 33 fits


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in comma_list(text))


@dataclass(frozen=True)
class VerifyCurveConfig:
    out: str | None = option(None, "folder for rows.json and table.md (default: ~/.cache/jetflow/verify-curve, "
                             "where auto_budget looks for this machine's curves)")
    backends: tuple[str, ...] = option(tuple(BACKENDS), "comma list of " + ", ".join(BACKENDS), parse=comma_list)
    modes: tuple[str, ...] = option(("eager", "compiled"), "eager, compiled or both (comma list)", parse=comma_list)
    sizes: tuple[int, ...] = option(SIZES, "verified tokens, root included (comma list)", parse=_ints)
    past_len: int = option(256, "cached prefix under every verify")
    repeats: int = option(5, "interleaved sweeps (medians)")
    threads: int = option(2, "torch threads")
    method: str = option("jetflow-pc+lookup", "the method whose tau the auto budget is calibrated on")
    calibrate: int = option(2, "MATH-500 prompts of the tau calibration (0: no auto budget)")
    max_new_tokens: int = option(64, "new tokens per calibration decode")
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")

    def __post_init__(self):
        bad = [b for b in self.backends if b not in BACKENDS] + [m for m in self.modes if m not in ("eager", "compiled")]
        if bad or not self.backends or not self.modes:
            raise ValueError(f"unknown backends or modes {bad}: backends {', '.join(BACKENDS)}; modes eager, compiled")
        if not self.sizes or min(self.sizes) < 1 or 1 not in self.sizes:
            raise ValueError(f"sizes must be >= 1 and include 1, got {self.sizes}")
        if self.past_len < 1 or self.repeats < 1 or self.threads < 1 or self.calibrate < 0:
            raise ValueError("past_len, repeats and threads must be >= 1, calibrate >= 0")


def _targets(cfg: VerifyCurveConfig) -> dict[str, object]:
    """backend key ("bf16", "q4-compiled", ...) -> target, in the order backends x modes."""
    out = {}
    for name in cfg.backends:
        for mode in cfg.modes:
            compiled = mode == "compiled"
            target = load_backend(name, compile=compiled, cache_len=CACHE_LEN if compiled else None)
            out[backend_of(target)] = target
    return out


@torch.no_grad()
def curves(targets: dict, sizes, past_len: int, repeats: int, seed: int = 0) -> tuple[dict, dict]:
    """(key -> {k: median seconds}, key -> {k: seconds of the untimed first sweep}); keys and sizes interleaved."""
    gen = torch.Generator().manual_seed(seed)
    first = next(iter(targets.values()))
    prefix = torch.randint(first.config.vocab_size, (past_len,), generator=gen)
    trees = {k: random_tree(k, first.config.vocab_size, gen) for k in sorted(set(sizes))}
    caches, first_s = {}, {}
    for key, target in targets.items():
        caches[key] = target.new_cache()
        target.forward(prefix, caches[key])
        first_s[key] = {k: time_verify_step(target, caches[key], tree, past_len) for k, tree in trees.items()}
    times = {key: {k: [] for k in trees} for key in targets}
    for _ in range(repeats):
        for key, target in targets.items():
            for k, tree in trees.items():
                times[key][k].append(time_verify_step(target, caches[key], tree, past_len))
    return {key: {k: statistics.median(v) for k, v in t.items()} for key, t in times.items()}, first_s


def budget_picks(cfg: VerifyCurveConfig, targets: dict, seconds: dict) -> dict[str, dict]:
    """key -> the auto budget against that curve, tau and draft seconds calibrated once per eager backend."""
    if not cfg.calibrate:
        return {}
    prompts = load_prompts("math500", limit=cfg.calibrate, data_dir=cfg.data_dir)
    budgets = [b for b in PICK_BUDGETS if b + 1 <= max(cfg.sizes)]
    cals, out = {}, {}
    for key, target in targets.items():
        base = key.removesuffix("-compiled")
        if base not in cals:  # the eager target of this dtype and quantization drafts and decodes the calibration
            cals[base] = calibrate(load_backend(base), cfg.method, prompts, budgets, cfg.max_new_tokens)
        cal = cals[base]
        best, table = pick_budget(cal.tau, seconds[key], draft_s=cal.draft_s)
        row = next(r for r in table if r["budget"] == best)
        out[key] = {"auto_budget": best, "tau": {str(b): t for b, t in cal.tau.items()},
                    "draft_s": {str(b): t for b, t in cal.draft_s.items()},
                    "predicted_tokens_per_s": row["predicted_tokens_per_s"], "calibration_prompts": [p["id"] for p in prompts]}
    return out


def measure(cfg: VerifyCurveConfig) -> list[dict]:
    """The setup row, then one curve row per backend key (seconds, AR steps, first-sweep seconds, auto budget)."""
    torch.set_num_threads(cfg.threads)
    cpu = {"cpu": hardware.cpu_model(), "bf16_native": bool(hardware.cpu_bf16_flags())}
    setup = {"kind": "setup", "hardware": hardware.describe(), "torch": torch.__version__, **cpu,
             "load_average_before": os.getloadavg()[0], "config": asdict(cfg)}
    targets = _targets(cfg)
    seconds, first = curves(targets, cfg.sizes, cfg.past_len, cfg.repeats)
    picks = budget_picks(cfg, targets, seconds)
    setup["load_average_after"] = os.getloadavg()[0]
    rows = [setup]
    for key, target in targets.items():
        s = seconds[key]
        rows.append({"kind": "curve", "backend": key, "model": target.name, "forward": forward_of(target),
                     "threads": cfg.threads, **cpu,
                     "past_len": cfg.past_len, "repeats": cfg.repeats,
                     "seconds": {str(k): v for k, v in sorted(s.items())},
                     "ar_steps": {str(k): v / s[1] for k, v in sorted(s.items())},
                     "first_sweep_s": {str(k): v for k, v in sorted(first[key].items())},
                     "compiled_sizes": sorted(target.engine.compile_s) if hasattr(target, "engine") else None,
                     **picks.get(key, {})})
    return rows


def to_markdown(rows: list[dict]) -> str:
    """One line per backend: ms per verify of k tokens, the 17-token verify in AR steps, the auto budget."""
    setup = next(r for r in rows if r["kind"] == "setup")
    curves_ = [r for r in rows if r["kind"] == "curve"]
    sizes = sorted({int(k) for r in curves_ for k in r["seconds"]})
    head = ["backend", *(f"{k}" for k in sizes), "17 in AR steps", "auto budget (tau)", "predicted tok/s"]
    lines = [f"Verify-cost curve, ms per verify step of k tokens (root included; forward, accept, compaction), "
             f"{setup['hardware']}; bf16 native: {setup['bf16_native']}; load average "
             f"{setup['load_average_before']:.1f} before, {setup['load_average_after']:.1f} after.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in curves_:
        ms = [f"{1000 * r['seconds'][str(k)]:.1f}" if str(k) in r["seconds"] else "" for k in sizes]
        steps = r["ar_steps"].get("17")
        pick = f"{r['auto_budget']} ({r['tau'][str(r['auto_budget'])]:.2f})" if "auto_budget" in r else ""
        pred = f"{r['predicted_tokens_per_s']:.1f}" if "auto_budget" in r else ""
        lines.append("| " + " | ".join([r["backend"], *ms, f"{steps:.2f}" if steps else "", pick, pred]) + " |")
    return "\n".join(lines) + "\n"


def out_dir(cfg: VerifyCurveConfig) -> Path:
    """Where the rows go: ``--out``, else the cache folder ``auto_budget`` reads first (``curve_files``)."""
    return Path(cfg.out) if cfg.out else curve_files()[0].parent


def run(cfg: VerifyCurveConfig) -> list[dict]:
    rows = measure(cfg)
    write_rows(rows, out_dir(cfg), to_markdown)
    return rows
