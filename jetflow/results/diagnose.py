"""The acceptance profile's and the diagnosis's runs: answer prompts, replay the causal head over them, count.

``profile_for_head`` (``python -m jetflow profile``) answers held-out TRAINING prompts greedily
(``jetflow.data.holdout``: drawn after the prompts the shipped heads trained on, or the rows the head's own
training held out, never a benchmark), counts where the target accepts the head's drafts
(``jetflow.drafting.profile.Counts``, over ``replay.draft_table``) and saves ``acceptance_profile.json``
beside the head. ``diagnose`` (``python -m jetflow diagnose``) counts the same on benchmark answers (and
held-out ones) and returns them as rows of the spine/off-spine table and the (depth, rank) heatmap
(``diagnosis_rows``; ``diagnosis_markdown`` their table):

    python -m jetflow profile --n 48 --out data/heads/smollm2-135m-jetflow
    python -m jetflow diagnose --datasets gsm8k,math500 --limit 20 --out data/results/cpu-diagnosis
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from jetflow.data.holdout import check_holdout, head_holdout_ids, heldout_prompts, holdout_answers, holdout_prompts
from jetflow.data.prompts import load_prompts, training_pool
from jetflow.data.regenerate import load_regenerated, regenerate
from jetflow.drafting.methods import make_proposer
from jetflow.drafting.profile import STATES, Counts, save_profile
from jetflow.engine.load import load_target
from jetflow.evaluation.replay import Trace, ar_traces, draft_table, trace_cache
from jetflow.util.hardware import environment
from jetflow.util.flags import command_line, option
from jetflow.util.paths import cache_dir, portable_path, shipped_head_dir


@dataclass(frozen=True)
class ProfileConfig:
    """``python -m jetflow profile``: the causal head's acceptance profile from held-out training prompts."""
    n: int = option(48, "held-out training prompts (drawn after the heads' own)")
    after: int = option(3030, "training prompts the head was trained on (training_prompts(after))")
    data: str | None = option(None, "the head's training data when it was trained with --holdout N (N = --n): "
                              "profile the prompts of those held-out rows instead of drawing after --after",
                              parse=lambda text: str(Path(text).expanduser()))
    max_new_tokens: int = option(256, "new tokens per answer")
    max_prompt_tokens: int = option(256, "longer prompts are skipped")
    ranks: int = option(32, "ranks R per depth the profile keeps")
    batch_size: int = option(8, "prompts per batched greedy answer")
    out: str | None = option(None, "head folder to write acceptance_profile.json into (default: the shipped causal head)")
    head: str | None = option(None, "head directory to profile (default: --out)")
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")


def counts_of(proposer, traces, n_rank: int, progress: bool = False, corrected: bool = False):
    """Counts over ``traces`` (``replay.Trace``) with ``proposer``'s head (fp32 drafts, like replay); with
    ``corrected`` a pair: the head's counts and the path-corrected ones, from the same drafts."""
    counts = [Counts(proposer.head.config.block_size - 1, n_rank) for _ in range(1 + corrected)]
    for t in tqdm(traces, desc="profile", disable=not progress, leave=False):
        wide = max(n_rank, 2, proposer.correction.config.candidates if corrected else 0)
        table = draft_table(proposer, t, wide, paths=corrected)
        counts[0].add(table.logp, table.ids, t.tokens)
        if corrected:
            counts[1].add(table.logp, table.ids, t.tokens, table.paths[max(table.paths)])  # the full C
    return tuple(counts) if corrected else counts[0]


def diagnosis_rows(counts: Counts, dataset: str, max_rank: int = 16, head: str = "causal") -> list[dict]:
    """Rows of the spine/off-spine table (one per depth and state: how often the argmax is right, and
    the top-4) and of the (depth, rank) heatmap (state ``spine`` / ``off_spine``, ranks < ``max_rank``);
    ``head``: ``causal`` (the head's rows) or ``corrected`` (the path-corrected rows)."""
    rows = []
    for s, state in enumerate(STATES):
        for d in range(counts.depths):
            n = int(counts.reached[s, d])
            hits = counts.hits[s, d].tolist()
            rows.append({"table": "spine", "dataset": dataset, "head": head, "state": state, "depth": d + 1, "reached": n,
                         "argmax_accept": hits[0] / n if n else None,
                         "top4_accept": sum(hits[:4]) / n if n else None})
            if s < 2:
                rows += [{"table": "heatmap", "dataset": dataset, "head": head, "state": state, "depth": d + 1, "rank": r,
                          "reached": n, "accept": hits[r] / n if n else None} for r in range(min(max_rank, counts.n_rank))]
    return rows


def diagnosis_markdown(rows: Sequence[dict]) -> str:
    """Argmax acceptance per depth, on the spine / off it / right after a sibling, one line per dataset and state."""
    spine = [r for r in rows if r["table"] == "spine"]
    depths = sorted({r["depth"] for r in spine})
    lines = ["| dataset | head | state | " + " | ".join(f"d={d}" for d in depths) + " |",
             "|---|---|---|" + "---|" * len(depths)]
    for key in dict.fromkeys((r["dataset"], r.get("head", "causal"), r["state"]) for r in spine):
        cells = {r["depth"]: r for r in spine if (r["dataset"], r.get("head", "causal"), r["state"]) == key}
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(
            "-" if cells[d]["argmax_accept"] is None else f"{cells[d]['argmax_accept']:.2f} ({cells[d]['reached']})"
            for d in depths) + " |")
    return "\n".join(lines) + ("\n\nP(the depth-d argmax is the target's token | the true path to depth d-1 is among "
                               "the top-32 per depth), by the ranks of that path: spine = all argmax, off_spine = "
                               "not, after_sibling = its last token is not the argmax; (anchors reached). head = causal: the "
                               "head's own rows; corrected: each depth's row re-scored given the true parent "
                               "(jetflow.drafting.correction), ranks among its C candidates\n")


def profile_command(cfg: "ProfileConfig") -> str:
    """The ``python -m jetflow profile`` line of ``cfg`` as any machine reads it: its local folders (--data,
    --out, --head) relative to the repository or the cache folder (``portable_path``); a hub id stays."""
    shown = replace(cfg, **{k: portable_path(v) for k in ("data", "out", "head")
                            if (v := getattr(cfg, k)) and Path(v).expanduser().exists()})
    return command_line(shown, ProfileConfig(), ["python", "-m", "jetflow", "profile"], skip=("data_dir",),
                        always=("n", "max_new_tokens", "ranks"))


def profile_for_head(cfg: ProfileConfig, progress: bool = True) -> Path:
    """Answer ``cfg.n`` held-out training prompts greedily (batched, fp32, resumable in the jetflow
    cache), count the causal head's acceptance on them, save the profile beside the head."""
    out = Path(cfg.out) if cfg.out else shipped_head_dir("jetflow")
    target = load_target(None, dtype="float32")
    if cfg.data:
        prompts = holdout_prompts(cfg.data, cfg.n, data_dir=cfg.data_dir)
        check_holdout(Path(cfg.head or out), {p["id"] for p in prompts})
        answers = holdout_answers({p["id"] for p in prompts}, cfg.max_new_tokens)
    else:
        prompts = heldout_prompts(cfg.n, after=cfg.after, data_dir=cfg.data_dir)
        answers = cache_dir() / "replay" / f"heldout-after{cfg.after}-n{cfg.n}-{cfg.max_new_tokens}.jsonl"
    regenerate(target, prompts, answers, batch_size=cfg.batch_size, max_new_tokens=cfg.max_new_tokens,
               max_prompt_tokens=cfg.max_prompt_tokens, progress=progress)
    traces = [Trace("training", r["id"], r["prompt_ids"], r["response_ids"], cfg.max_new_tokens)
              for r in load_regenerated(answers) if len(r["response_ids"]) > 1]
    proposer = make_proposer("jetflow", target, head=cfg.head or str(out), draft_dtype=torch.float32)
    counts = counts_of(proposer, traces, cfg.ranks, progress)
    command = profile_command(cfg)
    provenance = {"command": command, "prompts": [t.id for t in traces], "anchors": sum(len(t.tokens) - 1 for t in traces),
                  "answers": "greedy, batched (left-padded), fp32 target; drafts fp32", **environment(target)}
    return save_profile(counts.profile(), counts, out, provenance)


@dataclass(frozen=True)
class DiagnoseConfig:
    """``python -m jetflow diagnose``: spine/off-spine acceptance and the (depth, rank) heatmap on benchmarks."""
    datasets: tuple[str, ...] = option(("gsm8k", "math500", "humaneval", "mt_bench"), "comma list")
    limit: int = option(20, "first N prompts of each dataset")
    max_new_tokens: int = option(256, "new tokens of each AR answer (the replay cache's)")
    ranks: int = option(32, "a path is reached when every token on it ranks below this")
    heldout: int = option(0, "also the first N of the profile's held-out training prompts (dataset heldout; the "
                          "rows the head's training held out when it was trained with --holdout)")
    heldout_new_tokens: int = option(128, "new tokens of each held-out answer (batched greedy, cached)")
    data_dir: str | None = option(None, "offline data folder (default: $JETFLOW_DATA_DIR, else the hub)")


def heldout_traces(target, n: int, max_new_tokens: int, data_dir=None, progress: bool = False, head=None) -> list:
    """Greedy answers (batched, cached like ``profile``'s) of the first ``n`` held-out training prompts, as
    ``replay.Trace`` rows of dataset ``heldout``: the prompts ``head``'s training held out for its profile
    (``train --holdout``, listed in its provenance) when it did, else the 48 drawn after the first 3030."""
    kept = head_holdout_ids(head) if head is not None else set()
    if kept:
        prompts = [p for p in training_pool(data_dir=data_dir) if p["id"] in kept]
        answers = holdout_answers(kept, max_new_tokens)
    else:
        prompts = heldout_prompts(48, data_dir=data_dir)
        answers = cache_dir() / "replay" / f"heldout-after3030-n48-{max_new_tokens}.jsonl"
    if not answers.is_file():  # the profile's answers when it made them (an older file has no header to resume by)
        regenerate(target, prompts, answers, batch_size=8, max_new_tokens=max_new_tokens, max_prompt_tokens=256,
                   progress=progress)
    by_id = {r["id"]: r for r in load_regenerated(answers) if len(r["response_ids"]) > 1}
    rows = [by_id[p["id"]] for p in prompts if p["id"] in by_id][:n]
    return [Trace("heldout", r["id"], r["prompt_ids"], r["response_ids"], max_new_tokens) for r in rows]


def diagnose(cfg: DiagnoseConfig, progress: bool = True) -> list[dict]:
    """Diagnosis rows per dataset (AR answers from the replay cache, shipped causal head, fp32); where a
    path correction is saved beside the head, its corrected rows beside the head's own."""
    target = load_target(None, dtype="float32")
    proposer = make_proposer("jetflow", target, draft_dtype=torch.float32)
    corrected = proposer.correction is not None
    rows, env = [], environment(target)
    sets = [(ds, None) for ds in cfg.datasets] + ([("heldout", cfg.heldout)] if cfg.heldout else [])
    for ds, n in sets:
        if n is None:
            cache = trace_cache(target, ds)
            traces = ar_traces(target, load_prompts(ds, limit=cfg.limit, data_dir=cfg.data_dir), cfg.max_new_tokens,
                               dataset=ds, cache=cache, progress=progress)
        else:
            traces = heldout_traces(target, n, cfg.heldout_new_tokens, cfg.data_dir, progress,
                                    head=shipped_head_dir("jetflow"))
        counts = counts_of(proposer, traces, cfg.ranks, progress, corrected)
        for head, c in zip(("causal", "corrected"), counts if corrected else (counts,)):
            rows += [r | {"n_prompts": len(traces), **env} for r in diagnosis_rows(c, ds, head=head)]
    return rows
