"""Acceptance profiles: where in a tree the target actually accepts the causal head's drafts.

Greedy acceptance of a node depends only on the target's continuation (see ``replay``), so one pass of
the head over every anchor of an answer (``replay.draft_table``) tells, at each anchor and depth d, the
rank of the true next token in the head's sorted row (``truth_ranks``). A node at depth d is reached
when its path is the true one, so the profile counts, for every depth reached through ranks below R and
by whether that path stayed on the argmax spine (all rank 0) or left it:

- ``rank``: how often the rank-r token is the accepted one (the (depth, rank) heatmap),
- ``calibrated``: how often a token with head log-prob in bin e is (the head's confidence, calibrated).

``profile_for_head`` measures it on held-out TRAINING prompts (``heldout_prompts``: drawn after the
prompts the shipped heads trained on, never a benchmark) and saves ``acceptance_profile.json`` beside
the head, which ``make_proposer`` loads with it (the ``jetflow-cal`` and ``jetflow-profile`` builders
need it). ``diagnosis_rows`` are the same counts as rows, on any traces (the spine/off-spine table):

    python -m jetflow profile --n 48 --out data/heads/smollm2-135m-jetflow
    python -m jetflow diagnose --datasets gsm8k,math500 --limit 20 --out data/results/cpu-diagnosis
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from jetflow.util.flags import option
from jetflow.engine.tree import AcceptanceProfile

PROFILE_FILE = "acceptance_profile.json"
# head log-prob bin edges (the first bin is everything below -12): finer where the accepted mass is
EDGES = (-12.0, -10.0, -8.0, -7.0, -6.0, -5.0, -4.5, -4.0, -3.5, -3.0, -2.5, -2.0, -1.75, -1.5, -1.25, -1.0,
         -0.75, -0.5, -0.3, -0.15, -0.05, 0.0)
STATES = ("spine", "off_spine", "after_sibling")  # path so far all argmax / not / the parent itself not argmax


def truth_ranks(ids: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    """(A, D) long: rank of the true depth-d token in the head's row at anchor a, from the (A, D, K) drafted
    ids of ``draft_table`` (sorted best first); K when it is not among them, -1 past the answer's end."""
    a, d, k = ids.shape
    tok = torch.tensor(list(tokens), dtype=torch.long)
    idx = torch.arange(a)[:, None] + torch.arange(1, d + 1)[None]       # (A, D) output index of depth d
    valid = idx < tok.numel()
    truth = tok[idx.clamp(max=tok.numel() - 1)]                           # (A, D)
    match = ids == truth[..., None]                                       # (A, D, K)
    rank = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(truth, k))
    return torch.where(valid, rank, torch.full_like(rank, -1))


def corrected_ranks(paths: torch.Tensor, ranks: torch.Tensor) -> torch.Tensor:
    """(A, D) truth ranks under the path correction: depth 1 keeps the head's rank, depth d >= 2 takes the
    rank of the true token in the corrected row of its true parent (``paths`` (A, D-1, C, C) from
    ``replay.draft_table``); C when the token or its parent is not among the C candidates, -1 past the end."""
    c = paths.shape[-1]
    parent, child = ranks[:, :-1], ranks[:, 1:]                                   # (A, D-1)
    ok = (parent >= 0) & (parent < c) & (child >= 0) & (child < c)
    rows = paths.gather(2, parent.clamp(0, c - 1)[..., None, None].expand(-1, -1, 1, c))[:, :, 0]  # (A, D-1, C)
    mine = rows.gather(-1, child.clamp(0, c - 1)[..., None])                     # (A, D-1, 1)
    rank = (rows > mine).sum(-1)                                                  # ties: the best place
    out = torch.where(ok, rank, torch.where(child < 0, -1, c))
    return torch.cat([torch.where(ranks[:, :1] >= c, c, ranks[:, :1]), out], 1)


def path_states(ranks: torch.Tensor, n_rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For (A, D) truth ranks: ``reached`` (A, D) bool (every shallower depth's true token ranks below
    ``n_rank``, so a tree of the top ``n_rank`` per depth holds the parent), ``off`` (A, D) bool (one of
    them is not the argmax) and ``after`` (A, D) bool (the parent itself is not the argmax)."""
    ok = (ranks >= 0) & (ranks < n_rank)
    ones = torch.ones_like(ok[:, :1])
    reached = torch.cat([ones, ok[:, :-1]], 1).cumprod(1).bool() & (ranks >= 0)
    nonzero = ranks > 0
    off = torch.cat([~ones, nonzero[:, :-1]], 1).cummax(1).values
    after = torch.cat([~ones, nonzero[:, :-1]], 1)
    return reached, off, after


@dataclass
class Counts:
    """Acceptance counts over many anchors (``add`` one trace's drafts at a time)."""
    depths: int
    n_rank: int
    reached: torch.Tensor = None   # (3, D) anchors whose depth-d parent is reached, per state (STATES)
    hits: torch.Tensor = None      # (3, D, R) ... whose true token has rank r
    bin_total: torch.Tensor = None  # (2, D, E) candidates of rank < R in head log-prob bin e (spine, off)
    bin_hits: torch.Tensor = None  # (2, D, E) ... of them accepted

    def __post_init__(self):
        e = len(EDGES)
        self.reached = torch.zeros(3, self.depths, dtype=torch.long)
        self.hits = torch.zeros(3, self.depths, self.n_rank, dtype=torch.long)
        self.bin_total = torch.zeros(2, self.depths, e, dtype=torch.long)
        self.bin_hits = torch.zeros(2, self.depths, e, dtype=torch.long)

    def add(self, logp: torch.Tensor, ids: torch.Tensor, tokens: Sequence[int], paths: torch.Tensor | None = None
            ) -> None:
        """One trace: ``logp`` and ``ids`` (A, D, K) from ``draft_table``, ``tokens`` its answer; with the
        path correction's ``paths`` (A, D-1, C, C) the ranks are the corrected ones (``corrected_ranks``; the
        log-prob bins stay the head's, so ``profile`` is only meaningful without)."""
        ranks = truth_ranks(ids, tokens)                                  # (A, D)
        if paths is not None:
            ranks = corrected_ranks(paths, ranks)
        reached, off, after = path_states(ranks, self.n_rank)
        bins = torch.bucketize(logp[..., :self.n_rank].float().clamp(max=0.0), torch.tensor(EDGES[:-1]),
                               right=True)                                # (A, D, R) in 0..E-1
        hit = ranks[..., None] == torch.arange(self.n_rank)               # (A, D, R)
        for s, where in enumerate((reached & ~off, reached & off, reached & after)):
            self.reached[s] += where.sum(0)
            self.hits[s] += (hit & where[..., None]).sum(0)
            if s < 2:
                sel = where[..., None].expand_as(bins)
                for d in range(self.depths):
                    b, h = bins[:, d][sel[:, d]], hit[:, d][sel[:, d]]
                    self.bin_total[s, d] += torch.bincount(b, minlength=len(EDGES))
                    self.bin_hits[s, d] += torch.bincount(b[h], minlength=len(EDGES))

    def profile(self, prior: float = 1.0) -> AcceptanceProfile:
        """Rates, made monotone: per rank non-increasing in r (a running min), per bin non-decreasing in
        the head's log-prob (a running max), each bin shrunk toward its own head probability with
        ``prior`` pseudo-candidates so a sparse bin reads as what the head claims."""
        rank = self.hits[:2].float() / self.reached[:2, :, None].clamp(min=1)   # (2, D, R)
        rank = rank.cummin(-1).values
        lo = torch.tensor((EDGES[0] - 2.0,) + EDGES[:-1])                        # (E,) each bin's lower edge
        mid = ((lo + torch.tensor(EDGES)) / 2).exp()                             # (E,) its middle probability
        cal = (self.bin_hits.float() + prior * mid) / (self.bin_total.float() + prior)
        cal = cal.clamp(max=1.0).cummax(-1).values                               # (2, D, E)
        edges = torch.tensor((-math.inf,) + EDGES)
        return AcceptanceProfile(rank, edges, cal)


def save_profile(profile: AcceptanceProfile, counts: Counts, folder: str | Path, provenance: dict) -> Path:
    """``acceptance_profile.json`` in ``folder``: the rates, the counts they come from, and ``provenance``
    (the command, the prompts, the head)."""
    path = Path(folder) / PROFILE_FILE
    body = {"rank": profile.rank.tolist(), "edges": profile.edges[1:].tolist(), "calibrated": profile.calibrated.tolist(),
            "reached": counts.reached[:2].tolist(), "bin_total": counts.bin_total.tolist(),
            "provenance": provenance}
    path.write_text(json.dumps(body) + "\n")
    return path


def load_profile(folder: str | Path | None) -> AcceptanceProfile | None:
    """The profile saved beside a head (None when ``folder`` is not a directory or holds none)."""
    path = Path(folder) / PROFILE_FILE if folder is not None else None
    if path is None or not path.is_file():
        return None
    body = json.loads(path.read_text())
    return AcceptanceProfile(torch.tensor(body["rank"]), torch.tensor([-math.inf] + body["edges"]),
                             torch.tensor(body["calibrated"]))


def heldout_prompts(n: int, *, after: int = 3030, seed: int = 0, data_dir=None) -> list[dict]:
    """``n`` training prompts the shipped heads never saw: ``training_prompts(after + n)`` minus the
    ``after`` they were regenerated from (a larger draw keeps a smaller one's prompts)."""
    from jetflow.data.prompts import training_prompts
    seen = {p["id"] for p in training_prompts(after, seed=seed, data_dir=data_dir)}
    return [p for p in training_prompts(after + n, seed=seed, data_dir=data_dir) if p["id"] not in seen]


def holdout_prompts(data: str | Path, n: int, *, seed: int = 0, data_dir=None) -> list[dict]:
    """The prompts of the ``n`` rows that ``train --holdout n`` kept out of a head trained on ``data`` (a
    regenerated file, or a chunked folder: rows of its last part), from the training pool of ``seed``."""
    from jetflow.data.prompts import training_pool
    from jetflow.data.regenerate import data_files, is_last_part, load_regenerated
    from jetflow.training.train import holdout_rows
    last = data_files(data)[-1]
    if not is_last_part(last):
        raise ValueError(f"{last} is not the last part of {data} (the rest are still to regenerate); train --holdout "
                         "holds rows of the last part out")
    rows = load_regenerated(last)
    ids = {rows[i]["id"] for i in holdout_rows(rows, n, last)}
    prompts = [p for p in training_pool(seed=seed, data_dir=data_dir) if p["id"] in ids]
    if len(prompts) != len(ids):
        raise ValueError(f"{len(ids) - len(prompts)} of the {n} held-out ids of {last} are not in the training "
                         "pool of this data folder (another --data-dir or seed?)")
    return prompts


def holdout_answers(ids: set[str], max_new_tokens: int) -> Path:
    """Where the greedy fp32 answers to a head's held-out prompts are cached (named by a hash of their ids),
    shared by ``profile --data`` and the ``heldout`` diagnosis."""
    import hashlib
    from jetflow.util.paths import cache_dir
    tag = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:12]
    return cache_dir() / "replay" / f"holdout-{tag}-n{len(ids)}-{max_new_tokens}.jsonl"


def head_holdout_ids(head: str | Path) -> set[str]:
    """The ids of the rows a head's training held out for its profile (``train --holdout``; its provenance's
    ``data.holdout_ids``), empty for a head trained without."""
    prov = Path(head) / "provenance.json"
    return set(json.loads(prov.read_text())["data"].get("holdout_ids", ())) if prov.is_file() else set()


def check_holdout(head: Path, ids: set[str]) -> None:
    """Refuse to profile ``head`` on prompts it may have trained on: its provenance must list ``ids`` as the
    rows its training held out (``train --holdout``)."""
    kept = head_holdout_ids(head)
    if kept != ids:
        raise ValueError(f"{head} was not trained with these {len(ids)} rows held out (its provenance.json lists "
                         f"{len(kept)} held-out ids); train it with --holdout {len(ids)} on the same data")


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
    from tqdm.auto import tqdm

    from jetflow.evaluation.replay import draft_table
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
    from jetflow.util.paths import portable_path
    from jetflow.util.flags import command_line
    shown = replace(cfg, **{k: portable_path(v) for k in ("data", "out", "head")
                            if (v := getattr(cfg, k)) and Path(v).expanduser().exists()})
    return command_line(shown, ProfileConfig(), ["python", "-m", "jetflow", "profile"], skip=("data_dir",),
                        always=("n", "max_new_tokens", "ranks"))


def profile_for_head(cfg: ProfileConfig, progress: bool = True) -> Path:
    """Answer ``cfg.n`` held-out training prompts greedily (batched, fp32, resumable in the jetflow
    cache), count the causal head's acceptance on them, save the profile beside the head."""
    from jetflow.data.regenerate import load_regenerated, regenerate
    from jetflow.util.paths import cache_dir
    from .proposers import make_proposer
    from jetflow.util.paths import shipped_head_dir
    from jetflow.training.provenance import environment
    from jetflow.evaluation.replay import Trace
    from jetflow.engine.target import load_target
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
    from jetflow.data.prompts import training_pool
    from jetflow.data.regenerate import load_regenerated, regenerate
    from jetflow.util.paths import cache_dir
    from jetflow.evaluation.replay import Trace
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
    from jetflow.data.prompts import load_prompts
    from .proposers import make_proposer
    from jetflow.util.paths import shipped_head_dir
    from jetflow.training.provenance import environment
    from jetflow.evaluation.replay import ar_traces, trace_cache
    from jetflow.engine.target import load_target
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
