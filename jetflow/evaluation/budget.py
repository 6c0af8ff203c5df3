"""Hardware-aware budget (beyond the paper): pick the budget that maximises predicted decode speed.

A round commits tau(B) tokens and costs one draft pass plus one target forward over B + 1 tokens:

    tokens/s(B) ~= tau(B) / (verify_s(B + 1) + draft_s(B))

tau(B) comes from a short calibration with the real proposer; verify_s(k) from timing the verify
forward on this machine. On a GPU verify_s stays nearly flat up to a few hundred tokens, on a CPU it
grows almost linearly (docs/field-notes.md), so the best budget belongs to the hardware as much as to
the head.

    cost = measure_verify_cost(target)                        # {1: 0.055, 16: 0.086, ...} seconds
    cal = calibrate(target, "lookup", prompts, [16, 32, 64])  # tau and draft seconds per budget
    best, table = pick_budget(cal.tau, cost, draft_s=cal.draft_s)

The same curve in AR steps, plus one draft pass, saved beside the causal head (``CostCurve``,
``python -m jetflow cost --out data/heads/smollm2-135m-jetflow``), is what the per-round stop rule
(``builders.calibrated_stop``, the ``jetflow-stop`` method) weighs each next node against.
"""
from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from jetflow.engine import metrics
from jetflow.engine.decode import generate, verify_step
from jetflow.util import hardware
from jetflow.util.paths import REPO, cache_dir
from jetflow.util.flags import option
from jetflow.drafting.cost import COST_SIZES, CostCurve, interp_cost, save_cost
from jetflow.drafting.methods import make_proposer
from jetflow.engine.target import Target, keep_path
from jetflow.engine.load import backend_of, load_target
from jetflow.engine.tree import Tree
from jetflow.drafting.builders import accum_logp
from jetflow.engine.verify import greedy_accept


def random_tree(size: int, vocab_size: int, gen: torch.Generator, depths: int = 15, width: int = 7) -> Tree:
    """A tree of ``size`` tokens (root included) shaped like a JetFlow draft over random logits."""
    root = int(torch.randint(vocab_size, (1,), generator=gen))
    if size == 1:
        return Tree.from_lists([root], [-1])
    logp = torch.log_softmax(torch.randn(depths, vocab_size, generator=gen) * 3, -1)  # (D, V)
    return accum_logp(logp, size - 1, root, width)


def time_verify_step(target: Target, cache, tree: Tree, past_len: int) -> float:
    """Seconds for one verify step as the decode loop runs it: forward, accept, cache back to the prefix."""
    t0 = time.perf_counter()
    _, step = verify_step(target, tree, cache, ())
    greedy_accept(tree, step.logits)  # reads the logits back, which also waits for an accelerator
    keep_path(cache, past_len, [])
    return time.perf_counter() - t0


@torch.no_grad()
def measure_verify_cost(target: Target, sizes: Sequence[int] = (1, 16, 32, 64, 128, 256), past_len: int = 256,
                        repeats: int = 3, seed: int = 0) -> dict[int, float]:
    """Median seconds of a verify step of k tokens (a tree of k - 1 drafts + root: forward, accept,
    cache compaction) over a cache of ``past_len`` random tokens, for every k in ``sizes``, sizes
    interleaved across ``repeats``; see ``relative`` for cost / cost[1]."""
    if not sizes or min(sizes) < 1:
        raise ValueError(f"sizes must be >= 1, got {tuple(sizes)}")
    if past_len < 1 or repeats < 1:
        raise ValueError(f"past_len and repeats must be >= 1, got {past_len} and {repeats}")
    if past_len + max(sizes) > target.max_context:
        raise ValueError(f"past_len + {max(sizes)} exceeds the model's context of {target.max_context}")
    gen = torch.Generator().manual_seed(seed)
    vocab = target.config.vocab_size
    cache = target.new_cache()
    target.forward(torch.randint(vocab, (past_len,), generator=gen), cache)
    trees = {k: random_tree(k, vocab, gen) for k in sorted(set(sizes))}
    for tree in trees.values():  # warm-up: first calls of each shape pay one-off costs
        time_verify_step(target, cache, tree, past_len)
    times = {k: [] for k in trees}
    for _ in range(repeats):  # sizes interleaved, so machine drift hits them alike
        for k, tree in trees.items():
            times[k].append(time_verify_step(target, cache, tree, past_len))
    return {k: statistics.median(t) for k, t in times.items()}


def relative(cost_by_size: Mapping[int, float]) -> dict[int, float]:
    """Cost relative to a one-token forward (needs size 1)."""
    return {k: c / cost_by_size[1] for k, c in sorted(cost_by_size.items())}


def _per_budget(value: float | Mapping[int, float], budget: int) -> float:
    return value[budget] if isinstance(value, Mapping) else value


def predict_tokens_per_s(tau_by_budget: Mapping[int, float], cost_by_size: Mapping[int, float],
                         draft_cost: float | Mapping[int, float] = 0.0) -> dict[int, float]:
    """budget -> tau(B) / (cost(B + 1) + draft_cost(B)); ``draft_cost`` in seconds per round, one
    value for all budgets or budget -> value."""
    return {b: t / (interp_cost(cost_by_size, b + 1) + _per_budget(draft_cost, b))
            for b, t in sorted(tau_by_budget.items())}


def pick_budget(tau_by_budget: Mapping[int, float], cost_by_size: Mapping[int, float],
                draft_s: float | Mapping[int, float] = 0.0) -> tuple[int, list[dict]]:
    """(budget with the highest predicted tokens/s, the smaller on ties; one row per budget with
    tau, verify_s, draft_s and predicted_tokens_per_s)."""
    if not tau_by_budget:
        raise ValueError("tau_by_budget is empty")
    pred = predict_tokens_per_s(tau_by_budget, cost_by_size, draft_s)
    table = [{"budget": b, "tau": tau_by_budget[b], "verify_s": interp_cost(cost_by_size, b + 1),
              "draft_s": _per_budget(draft_s, b), "predicted_tokens_per_s": p} for b, p in pred.items()]
    best = max(table, key=lambda row: (row["predicted_tokens_per_s"], -row["budget"]))
    return best["budget"], table


@dataclass
class Calibration:
    tau: dict[int, float]      # budget -> mean tokens committed per round
    draft_s: dict[int, float]  # budget -> median draft seconds per round
    verify_s: dict[int, float]  # budget -> median verify seconds per round (as decoded, for reference)


def calibrate(target: Target, method: str, prompts: Sequence, budgets: Sequence[int], max_new_tokens: int = 64,
              *, temperature: float = 0.0, head: str | None = None) -> Calibration:
    """Decode ``prompts`` (texts, {"prompt": ...} rows or id tensors) at every budget with ``method``
    (``head``: its head directory or hub id, as for ``make_proposer``)."""
    if not prompts or not budgets:
        raise ValueError("calibrate needs at least one prompt and one budget")
    proposer = make_proposer(method, target, head=head)
    texts = [p["prompt"] if isinstance(p, Mapping) else p for p in prompts]
    tau, draft, verify = {}, {}, {}
    for b in budgets:
        rounds = [r for i, p in enumerate(texts)
                  for r in generate(target, p, proposer, budget=b, max_new_tokens=max_new_tokens,
                                   temperature=temperature, seed=i).rounds]
        if not rounds:
            raise ValueError(f"calibration at budget {b} decoded no rounds; raise max_new_tokens")
        tau[b] = metrics.tau(rounds)
        draft[b] = statistics.median(r.draft_s for r in rounds)
        verify[b] = statistics.median(r.verify_s for r in rounds)
    return Calibration(tau, draft, verify)


CANDIDATES = (8, 16, 32, 64, 128, 255)  # budgets auto_budget tries by default
CURVE_ENTRY = "cpu-verify-curve"  # the committed verify-cost curves (python -m jetflow results cpu-verify-curve)


def curve_files() -> tuple[Path, ...]:
    """Where saved verify-cost curves are looked up, the user's own run first: ``verify-curve``'s default
    folder under the cache, then the committed results entry of the checkout."""
    return cache_dir() / "verify-curve" / "rows.json", REPO / "data" / "results" / CURVE_ENTRY / "rows.json"


def forward_of(target: Target) -> str:
    """Which forward a target's verify runs through, part of a saved curve's key: "Target" (transformers'),
    "LeanTarget" (``jetflow.engine.lean``) or "CompiledTarget"; curves saved before the key existed are "Target"."""
    return type(target).__name__


def saved_cost(target: Target, files: Sequence[Path] | None = None) -> dict[int, float] | None:
    """{k: seconds} of a saved verify-cost curve (``python -m jetflow verify-curve``) of this target's backend
    (``backend_of``: dtype, quantization, compiled or not), forward (``forward_of``) and model, on this CPU model at
    this torch thread count; None when no saved curve matches (then ``auto_budget`` measures)."""
    want = {"model": target.name, "backend": backend_of(target), "cpu": hardware.cpu_model(),
            "threads": torch.get_num_threads(), "forward": forward_of(target)}
    for path in curve_files() if files is None else files:
        try:
            rows = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            continue
        for row in rows if isinstance(rows, list) else ():
            if row.get("kind") == "curve" and all(row.get(k, "Target" if k == "forward" else None) == v
                                                  for k, v in want.items()):
                return {int(k): float(v) for k, v in row["seconds"].items()}
    return None


def auto_budget(target: Target, method: str, prompts, *, budgets: Sequence[int] = CANDIDATES,
                head: str | None = None, max_new_tokens: int = 64, temperature: float = 0.0,
                cost_by_size: Mapping[int, float] | None = None) -> tuple[int, float]:
    """(best budget, its predicted decode tokens/s) for ``method`` on this machine: calibrate on
    ``prompts`` (one text or a list) and pick against the verify-cost curve: ``cost_by_size``, else the
    saved curve of this backend (``saved_cost``; candidates limited to the trees it measured), else one
    timed here at each candidate size."""
    prompts = [prompts] if isinstance(prompts, (str, torch.Tensor)) else list(prompts)
    cost = cost_by_size or saved_cost(target)
    if cost is not None and not cost_by_size:
        budgets = [b for b in budgets if b + 1 <= max(cost)] or [max(cost) - 1]
    sizes = (1,) if method == "ar" else sorted({1, *(b + 1 for b in budgets)})
    cost = cost or measure_verify_cost(target, sizes, past_len=min(256, target.max_context - sizes[-1]))
    if method == "ar":  # the root alone: one token per one-token verify, budget unused
        return 1, 1 / interp_cost(cost, 1)
    cal = calibrate(target, method, prompts, budgets, max_new_tokens, temperature=temperature, head=head)
    best, table = pick_budget(cal.tau, cost, draft_s=cal.draft_s)
    return best, next(row["predicted_tokens_per_s"] for row in table if row["budget"] == best)


@dataclass(frozen=True)
class CostConfig:
    """``python -m jetflow cost``: the round-cost curve of this machine, saved beside the causal head."""
    out: str = option(None, "folder to save verify_cost.json in (e.g. data/heads/smollm2-135m-jetflow)")
    model: str | None = option(None, "target hub id or local dir (default: the embedded SmolLM2)")
    dtype: str = option("float32", "the target's dtype")
    sizes: tuple[int, ...] = option(COST_SIZES, "verified tokens (root included), comma list")
    past_len: int = option(256, "cached prefix under every verify")
    repeats: int = option(5, "interleaved sweeps of the curve (medians)")
    draft_method: str = option("jetflow-bp", "head method whose draft pass is timed against AR steps")

    def __post_init__(self):
        sizes = self.sizes.split(",") if isinstance(self.sizes, str) else self.sizes
        object.__setattr__(self, "sizes", tuple(int(s) for s in sizes if str(s).strip()))
        if not self.out:
            raise ValueError("--out is required: the head folder to save the cost curve in")


DRAFT_PROMPT = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. " \
               "How many clips did Natalia sell altogether in April and May?"


@torch.no_grad()
def measure_cost(cfg: CostConfig) -> Path:
    """Measure the verify curve (``measure_verify_cost``, relative to its one-token step) and one draft pass
    (median draft seconds of ``draft_method``'s rounds over the median AR step of the same prompt, both
    decoded here), save both beside the head."""
    target = load_target(cfg.model, dtype=cfg.dtype)
    seconds = measure_verify_cost(target, cfg.sizes, past_len=cfg.past_len, repeats=cfg.repeats)
    proposer = make_proposer(cfg.draft_method, target, draft_dtype=target.dtype)
    ar = generate(target, DRAFT_PROMPT, None, max_new_tokens=64)
    spec = generate(target, DRAFT_PROMPT, proposer, budget=16, max_new_tokens=64)
    draft = statistics.median(r.draft_s for r in spec.rounds) / statistics.median(r.verify_s for r in ar.rounds)
    curve = CostCurve(relative(seconds), draft)
    return save_cost(curve, cfg.out, seconds=[[k, s] for k, s in sorted(seconds.items())],
                     dtype=cfg.dtype, past_len=cfg.past_len, repeats=cfg.repeats, draft_method=cfg.draft_method,
                     hardware=hardware.describe(), command=f"python -m jetflow cost --out {cfg.out} --dtype {cfg.dtype}")
