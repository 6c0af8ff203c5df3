"""Continuation after an accepted sibling: does the drafter's next guess follow the node the target took?

A tree drafts several children under a node; the first child is the most probable one (highest cumulative
draft log-prob). When the target accepts a child that is NOT its parent's first one (a sibling), a drafter
that drew the next depth for its own first choice is now guessing after the wrong prefix. Per accepted draft
node that has drafted children, this module asks: is the node its parent's first child (spine) or not
(sibling), and is the target's next token that node's own first child? Pure torch on a ``Tree`` (docs/method.md,
"Continuation after a sibling", works an example through).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Continuation:
    """One round's counts: accepted sibling / spine nodes with drafted children, and how many of each had
    the target's next token equal to their first child; ``branched`` whether any node had two children."""
    sibling_hit: int = 0
    sibling_n: int = 0
    spine_hit: int = 0
    spine_n: int = 0
    branched: bool = False


def first_children(parents: torch.Tensor, score: torch.Tensor) -> list[int]:
    """Per node, its most probable child (highest score, the earliest on a tie), -1 for a leaf."""
    best: list[int] = [-1] * parents.numel()
    scores = score.tolist()
    for child, parent in enumerate(parents.tolist()):
        if parent >= 0 and (best[parent] < 0 or scores[child] > scores[best[parent]]):
            best[parent] = child
    return best


def continuation_counts(tree, path: list[int], committed: list[int],
                        target_choice: list[int] | None = None) -> Continuation:
    """Counts of one round: ``path`` the accepted node indices (root first), ``committed`` the tokens the
    round committed (accepted drafts, then the bonus): ``committed[i]`` is the target's next token after
    ``path[i]``, its argmax or its sample. Where a stop truncated ``committed``, ``target_choice[node]`` (the
    target's argmax at every node) stands in, or the node is skipped. Accepted leaves are skipped too: no
    drafted next guess to judge."""
    parents = tree.parents.tolist()
    first = first_children(tree.parents, tree.score)
    tokens = tree.tokens.tolist()
    counts = {"sibling": [0, 0], "spine": [0, 0]}
    for i, node in enumerate(path[1:], start=1):
        if i < len(committed):
            nxt = committed[i]
        elif target_choice is not None:
            nxt = target_choice[node]
        else:
            continue
        if first[node] < 0:
            continue
        kind = "spine" if first[parents[node]] == node else "sibling"
        counts[kind][0] += tokens[first[node]] == nxt
        counts[kind][1] += 1
    kids = torch.bincount(tree.parents[1:].clamp(min=0), minlength=len(tree)) if len(tree) > 1 else None
    return Continuation(counts["sibling"][0], counts["sibling"][1], counts["spine"][0], counts["spine"][1],
                        bool(kids is not None and int(kids.max()) > 1))


def continuation_rates(counts) -> dict:
    """``sibling_continuation``/``sibling_n``/``spine_continuation``/``spine_n`` over rounds' ``Continuation``
    counts; all None where no round's tree branched (a chain has no siblings: no value, never a zero)."""
    counts = list(counts)
    if not any(c.branched for c in counts):
        return {"sibling_continuation": None, "sibling_n": None, "spine_continuation": None, "spine_n": None}
    sib_n, spine_n = sum(c.sibling_n for c in counts), sum(c.spine_n for c in counts)
    return {"sibling_continuation": sum(c.sibling_hit for c in counts) / sib_n if sib_n else None,
            "sibling_n": sib_n,
            "spine_continuation": sum(c.spine_hit for c in counts) / spine_n if spine_n else None,
            "spine_n": spine_n}
