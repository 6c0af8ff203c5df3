"""What the path correction costs per round (``python -m jetflow correction-cost``): the head pass, the path
table and the path builders against ``best_prefix`` on the same log-probs, beside one verify pass, all timed in
one process, interleaved.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from jetflow.data.prompts import load_prompts
from jetflow.drafting.builders import best_prefix, path_prefix, path_tail_prefix
from jetflow.drafting.methods import make_proposer
from jetflow.engine.decode import verify_step
from jetflow.engine.load import load_target
from jetflow.engine.target import keep_path
from jetflow.util.flags import option
from jetflow.util.hardware import environment


@dataclass(frozen=True)
class CostConfig:
    """``python -m jetflow correction-cost``: what the path correction adds to a round, beside a verify pass."""
    prompts: int = option(3, "first N GSM8K prompts (each prefilled once; every timing at its answer's start)")
    budgets: tuple[int, ...] = option((16, 64, 128, 255), "comma list")
    reps: int = option(20, "repetitions of each timed step (the median is kept)")
    dtype: str = option("bfloat16", "target dtype (the head drafts in the machine's fast dtype)")
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")


def median_ms(fn, reps: int) -> float:
    """The median wall time of ``reps`` calls of ``fn``, in milliseconds."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return 1000 * sorted(times)[len(times) // 2]


@torch.no_grad()
def correction_cost(cfg: CostConfig) -> list[dict]:
    """Per budget, median ms of the head pass, the path table (C' = ``correction.table_size(budget)``),
    ``path_prefix`` and ``path_tail_prefix`` against ``best_prefix`` on the same log-probs, and one verify
    pass of the ``path_prefix`` tree; the correction's cost is the table plus the builder's difference
    (``jetflow-pc``; ``_pcx``: ``jetflow-pcx``), also as a fraction of the verify pass. All timed in one
    process, interleaved."""
    target = load_target(None, dtype=cfg.dtype)
    proposer = make_proposer("jetflow-pc", target)
    if proposer.correction is None:
        raise ValueError("no correction.safetensors beside the causal head; train one with python -m jetflow train-correction")
    rows, env = [], environment(target)
    for p in load_prompts("gsm8k", limit=cfg.prompts, data_dir=cfg.data_dir):
        ids = target.encode(p["prompt"])
        cache = target.new_cache()
        step = target.forward(ids, cache, taps=proposer.taps)
        state, anchor = proposer.start(ids), int(step.logits[-1].argmax())
        hidden = proposer.depth_hidden(state, ids.tolist() + [anchor], step.taps)
        logp = proposer.logp(hidden)
        past = cache.get_seq_length()
        for b in cfg.budgets:
            paths = proposer.paths(hidden, logp, budget=b)  # the round's C' = correction.table_size(b)
            tree = path_prefix(logp, b, anchor, paths)
            tree = type(tree)(tree.tokens.clone(), tree.parents, tree.depth, tree.score)
            tree.tokens[1:] = proposer.vocab[tree.tokens[1:]] if proposer.vocab is not None else tree.tokens[1:]

            def verify():
                verify_step(target, tree, cache, proposer.taps)
                keep_path(cache, past, [])  # back to the prefix for the next repetition
            ms = {"head_ms": median_ms(lambda: proposer.head.draft_block(state.head, anchor, proposer.embed), cfg.reps),
                  "table_ms": median_ms(lambda: proposer.paths(hidden, logp, budget=b), cfg.reps),
                  "build_pc_ms": median_ms(lambda: path_prefix(logp, b, anchor, paths), cfg.reps),
                  "build_pcx_ms": median_ms(lambda: path_tail_prefix(logp, b, anchor, paths), cfg.reps),
                  "build_bp_ms": median_ms(lambda: best_prefix(logp, b, anchor), cfg.reps),
                  "verify_ms": median_ms(verify, max(3, cfg.reps // 4))}
            ms["correction_ms"] = ms["table_ms"] + ms["build_pc_ms"] - ms["build_bp_ms"]
            ms["correction_pcx_ms"] = ms["table_ms"] + ms["build_pcx_ms"] - ms["build_bp_ms"]
            rows.append({"prompt": p["id"], "budget": b, "candidates": paths.shape[-1], **ms,
                         "correction_over_verify": ms["correction_ms"] / ms["verify_ms"],
                         "correction_pcx_over_verify": ms["correction_pcx_ms"] / ms["verify_ms"], **env})
    return rows


def cost_markdown(rows: list[dict]) -> str:
    """Median over prompts of each step's ms per budget, and the correction's share of a verify pass."""
    keys = ("head_ms", "table_ms", "build_bp_ms", "build_pc_ms", "build_pcx_ms", "correction_ms", "correction_pcx_ms",
            "verify_ms", "correction_over_verify", "correction_pcx_over_verify")
    lines = ["| budget | C' | " + " | ".join(keys) + " |", "|---|---|" + "---|" * len(keys)]
    for b in sorted({r["budget"] for r in rows}):
        mine = [r for r in rows if r["budget"] == b]
        med = {k: sorted(r[k] for r in mine)[len(mine) // 2] for k in keys}
        lines.append(f"| {b} | {mine[0].get('candidates', '-')} | " + " | ".join(
            f"{med[k]:.3f}" if k.endswith("over_verify") else f"{med[k]:.2f}" for k in keys) + " |")
    hw = rows[0]["hardware"] if rows else ""
    return "\n".join(lines) + (f"\n\nms per round step, median over {len({r['prompt'] for r in rows})} GSM8K prompts "
                               f"(each step the median of its repetitions), one process; {hw}\n")
