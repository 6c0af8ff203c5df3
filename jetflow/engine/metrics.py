"""Row statistics, pure: what a bench or a replay reports of a list of rounds, and the ratios between rows.

tau = mean tokens committed per round including the bonus token (the one definition every module uses);
per-depth acceptance, verify tokens, throughput and speedup (totals over the same prompts, then the
ratio), the simulated tau of training's per-depth accuracies, and the predicted speedups of an
auto-budget run. A ``PromptRun`` is what one prompt decoded by one variant leaves (the bench journals it);
``DecodedRound`` names the fields of a decoded round the statistics read. Nothing here touches a model:
``tests/test_metrics.py`` checks it on hand-made rounds.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import astuple, dataclass, field
from typing import Protocol

import torch

from .continuation import Continuation, continuation_counts, continuation_rates


class DraftedTree(Protocol):
    """What the statistics read of a round's tree (``engine.tree.Tree`` has it): nodes, root included."""
    tokens: torch.Tensor    # (N+1,) token id of every node
    parents: torch.Tensor   # (N+1,) parent index of every node
    depth: torch.Tensor     # (N+1,) depth of every node, the root 0
    score: torch.Tensor     # (N+1,) cumulative draft log-prob: a node's first child is its best-scored one

    def __len__(self) -> int: ...


class DecodedRound(Protocol):
    """The fields of a decoded round the statistics read (``engine.decode.Round`` has them)."""
    @property
    def tree(self) -> DraftedTree: ...

    @property
    def path(self) -> list[int]: ...       # accepted node indices, root first

    @property
    def committed(self) -> list[int]: ...  # tokens committed, bonus included

    @property
    def accepted(self) -> int: ...         # draft tokens accepted

    @property
    def target_choice(self) -> list[int]: ...  # the target's argmax after every node


@dataclass(frozen=True)
class RoundStat:
    """What the row statistics need of one round: a ``Round`` without its tree (small enough to journal)."""
    committed: int   # tokens committed, bonus included
    accepted: int    # draft tokens accepted
    verified: int    # tree nodes the target verified, root included
    deepest: int     # deepest drafted depth (0 for the root alone)
    chances: int     # leading accepted nodes, root first, that had a drafted child
    # continuation after the accepted node (jetflow.engine.continuation); journals written before these
    # fields load with the defaults and report no continuation
    sibling_hit: int = 0
    sibling_n: int = 0
    spine_hit: int = 0
    spine_n: int = 0
    branched: bool = False

    @classmethod
    def of(cls, r: DecodedRound | RoundStat) -> RoundStat:
        if isinstance(r, RoundStat):
            return r
        parents = set(r.tree.parents.tolist())
        chances = next((i for i, node in enumerate(r.path) if node not in parents), len(r.path))
        cont = continuation_counts(r.tree, r.path, r.committed, getattr(r, "target_choice", None))
        return cls(len(r.committed), r.accepted, len(r.tree), int(r.tree.depth.max()), chances,
                   cont.sibling_hit, cont.sibling_n, cont.spine_hit, cont.spine_n, cont.branched)

    @property
    def continuation(self) -> Continuation:
        return Continuation(self.sibling_hit, self.sibling_n, self.spine_hit, self.spine_n, self.branched)


@dataclass
class PromptRun:
    """One prompt decoded by one variant: all ``summarize`` needs, small enough to journal."""
    tokens: list[int]          # generated ids
    decode_tokens: int         # tokens produced inside the timed decode region
    decode_s: float
    prefill_s: float | None    # None where not separable (hf)
    rounds: list[RoundStat] = field(default_factory=list)  # empty for hf

    def to_json(self) -> dict:
        return {"tokens": self.tokens, "decode_tokens": self.decode_tokens, "decode_s": self.decode_s,
                "prefill_s": self.prefill_s, "rounds": [astuple(r) for r in self.rounds]}

    @classmethod
    def from_json(cls, d: Mapping) -> PromptRun:
        return cls(list(d["tokens"]), d["decode_tokens"], d["decode_s"], d["prefill_s"],
                   [RoundStat(*r) for r in d["rounds"]])


def tau(rounds: Sequence[DecodedRound | RoundStat]) -> float | None:
    """Mean tokens committed per round, bonus included; None without rounds (hf)."""
    return sum(RoundStat.of(r).committed for r in rounds) / len(rounds) if rounds else None


def tau_hist(rounds: Sequence[DecodedRound | RoundStat]) -> dict[int, int]:
    """Tokens committed in a round -> number of such rounds, ascending."""
    return dict(sorted(Counter(RoundStat.of(r).committed for r in rounds).items()))


def depth_accept(rounds: Sequence[DecodedRound | RoundStat]) -> list[float | None]:
    """Entry d-1: of the rounds that accepted depth d-1 and drafted a child of that accepted node,
    the fraction that accepted depth d (None where no round had that chance)."""
    stats = [RoundStat.of(r) for r in rounds]
    deepest = max((s.deepest for s in stats), default=0)
    tried, hit = [0] * deepest, [0] * deepest
    for s in stats:
        for d in range(1, min(s.chances, deepest) + 1):
            tried[d - 1] += 1
            hit[d - 1] += s.accepted >= d
    return [h / t if t else None for h, t in zip(hit, tried)]


def verify_tokens(rounds: Sequence[DecodedRound | RoundStat]) -> float | None:
    """Mean tokens the target verified per round (tree nodes including the root)."""
    return sum(RoundStat.of(r).verified for r in rounds) / len(rounds) if rounds else None


def throughput(tokens: int, seconds: float) -> float | None:
    """Tokens per second; None when nothing was timed (e.g. max_new_tokens=1 leaves no round)."""
    return tokens / seconds if seconds > 0 else None


def speedup(tokens: int, seconds: float, ar_tokens: int, ar_seconds: float) -> float | None:
    """(tokens / seconds) / (ar_tokens / ar_seconds): totals over the same prompts, then the ratio."""
    rate, ar_rate = throughput(tokens, seconds), throughput(ar_tokens, ar_seconds)
    return rate / ar_rate if rate is not None and ar_rate else None


def continuation(rounds: Sequence[DecodedRound | RoundStat]) -> dict:
    """``sibling_continuation``, ``sibling_n``, ``spine_continuation``, ``spine_n`` of the rounds
    (``jetflow.engine.continuation``): all None for a chain method, whose trees never branch."""
    return continuation_rates(RoundStat.of(r).continuation for r in rounds)


def round_stats(rounds: Sequence[DecodedRound | RoundStat]) -> dict:
    """The per-round statistics of a row: tau, its histogram, per-depth acceptance, verify tokens, and the
    continuation after accepted siblings and first children."""
    return {"tau": tau(rounds), "tau_hist": tau_hist(rounds), "depth_accept": depth_accept(rounds),
            "verify_tokens": verify_tokens(rounds), **continuation(rounds)}


def summarize(runs: Sequence[PromptRun], ar_runs: Sequence[PromptRun]) -> dict:
    """Row statistics of one configuration against the AR runs of the same prompts."""
    rounds = [r for run in runs for r in run.rounds]
    tokens, secs = sum(r.decode_tokens for r in runs), sum(r.decode_s for r in runs)
    ar_tokens, ar_secs = sum(r.decode_tokens for r in ar_runs), sum(r.decode_s for r in ar_runs)
    prefill = [r.prefill_s for r in runs]
    return {"n_prompts": len(runs), "new_tokens": sum(len(r.tokens) for r in runs), **round_stats(rounds),
            "prefill_s": None if None in prefill else sum(prefill), "decode_s": secs,
            "tokens_per_s": throughput(tokens, secs), "speedup": speedup(tokens, secs, ar_tokens, ar_secs),
            "identical_to_ar": sum(a.tokens == b.tokens for a, b in zip(runs, ar_runs))}


def simulated_tau(acc) -> float:
    """1 + sum_k prod_{i<=k} acc_i (docs/method.md, Training)."""
    return 1.0 + float(torch.tensor(acc, dtype=torch.float64).cumprod(0).sum())


def predicted_speedups(rows: Sequence[dict]) -> list[float | None]:
    """Each row's predicted tokens/s over the predicted AR tokens/s of its dataset (None where either is
    missing). Both predictions come from one cost table timed in one go, so machine load, which shifts
    predicted and measured tokens/s alike, cancels: this is the number to hold against ``speedup``."""
    ar = {r["dataset"]: r.get("predicted_tokens_per_s") for r in rows if r["method"] == "ar"}
    return [r["predicted_tokens_per_s"] / ar[r["dataset"]]
            if r.get("predicted_tokens_per_s") and ar.get(r["dataset"]) else None for r in rows]
