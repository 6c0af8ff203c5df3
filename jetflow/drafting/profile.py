"""Acceptance profiles: where in a tree the target actually accepts the causal head's drafts.

Greedy acceptance of a node depends only on the target's continuation (see ``replay``), so one pass of
the head over every anchor of an answer (``replay.draft_table``) tells, at each anchor and depth d, the
rank of the true next token in the head's sorted row (``truth_ranks``). A node at depth d is reached
when its path is the true one, so the profile counts, for every depth reached through ranks below R and
by whether that path stayed on the argmax spine (all rank 0) or left it:

- ``rank``: how often the rank-r token is the accepted one (the (depth, rank) heatmap),
- ``calibrated``: how often a token with head log-prob in bin e is (the head's confidence, calibrated).

``jetflow.results.diagnose.profile_for_head`` counts it on held-out TRAINING prompts
(``jetflow.data.holdout``) and saves ``acceptance_profile.json`` beside the head (``save_profile``), which
``make_proposer`` loads with it (``load_profile``; the ``jetflow-cal`` and ``jetflow-profile`` builders
need it); ``jetflow.results.diagnose.diagnosis_rows`` are the same counts as rows, on any traces.
"""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .builders import AcceptanceProfile

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
