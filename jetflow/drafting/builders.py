"""Tree builders: per-depth draft log-probs in, a candidate ``Tree`` out (docs/method.md, Tree builders), the
paper's three and those beyond it, all registered in ``BUILDERS``; and the acceptance profile and round-cost curve
that some of them read.

Builders take per-depth log-probs ``logp`` of shape (D, V): row d-1 is the draft distribution of depth d, shared
by every node at that depth. A node's rank is its token's rank in its depth's row (0 = the argmax); the argmax
spine is the path of rank-0 nodes. Pure torch over ``jetflow.engine.tree.Tree``.
"""
from __future__ import annotations

import functools
import heapq
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from jetflow.engine.tree import Tree


@dataclass(frozen=True)
class AcceptanceProfile:
    """Measured acceptance of the draft nodes, from replayed rounds (``jetflow.drafting.profile``). A node is
    accepted when the target's greedy continuation passes through it; every rate is conditioned on its
    parent being reached, and split by whether that parent is on the argmax spine (s=0) or off it (s=1)."""
    rank: torch.Tensor        # (2, D, R) float: P(the rank-r token of depth d is accepted | parent reached, s)
    edges: torch.Tensor       # (E+1,) float: ascending head log-prob bin edges, -inf first, 0 last
    calibrated: torch.Tensor  # (2, D, E) float: P(accepted | head log-prob in bin e, depth d, s), non-decreasing in e

    def __post_init__(self):
        s, d, e = self.calibrated.shape
        if s != 2 or self.rank.shape[:2] != (2, d) or self.edges.numel() != e + 1:
            raise ValueError(f"inconsistent profile shapes: rank {tuple(self.rank.shape)}, edges "
                             f"{tuple(self.edges.shape)}, calibrated {tuple(self.calibrated.shape)}")

    @property
    def depths(self) -> int:
        return self.rank.shape[1]

    def calibrate(self, logp: torch.Tensor, off_spine: int) -> torch.Tensor:
        """(D, K) head log-probs -> (D, K) log of their measured acceptance for a parent on (0) or off (1)
        the spine; depths past the profile's take its last depth's rates."""
        bins = (torch.bucketize(logp.float().clamp(max=0.0), self.edges[1:-1].float(), right=True))  # (D, K)
        rows = torch.arange(logp.shape[0]).clamp(max=self.depths - 1)
        return self.calibrated[off_spine][rows[:, None], bins].float().clamp(min=1e-9).log()


def _check(logp: torch.Tensor, budget: int) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must be (depths, vocab), got shape {tuple(logp.shape)}")
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")


def chain(logp: torch.Tensor, budget: int, root: int) -> Tree:
    """DFlash's draft: the argmax token at every depth, min(budget, D) nodes deep."""
    _check(logp, budget)
    n = min(budget, logp.shape[0])
    best, idx = logp[:n].float().max(dim=-1)  # (n,)
    return Tree(
        tokens=torch.cat([torch.tensor([root]), idx.cpu()]),
        parents=torch.arange(-1, n, dtype=torch.long),
        depth=torch.arange(0, n + 1, dtype=torch.long),
        score=torch.cat([torch.zeros(1), best.cpu().cumsum(0)]),
    )


def accum_logp(logp: torch.Tensor, budget: int, root: int, width: int = 7) -> Tree:
    """JetFlow's Algorithm 1: best-first expansion keyed by cumulative log-prob.

    Pop the highest-scoring node (ties: first pushed) at depth d < D and attach its up-to-W
    children, the top-W tokens of depth d+1, until ``budget`` nodes are placed.
    """
    _check(logp, budget)
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    top_lp, top_tok = logp.float().topk(min(width, logp.shape[1]), dim=-1)  # (D, W)
    top_lp, top_tok = top_lp.cpu().tolist(), top_tok.cpu().tolist()
    depth_max = len(top_lp)
    tokens, parents, depth, score = [root], [-1], [0], [0.0]
    order = itertools.count()
    heap = [(-0.0, next(order), 0)]
    while heap and len(tokens) - 1 < budget:
        _, _, node = heapq.heappop(heap)
        d = depth[node]
        if d >= depth_max:
            continue
        for lp, tok in zip(top_lp[d], top_tok[d]):
            if len(tokens) - 1 >= budget:
                break
            tokens.append(tok); parents.append(node); depth.append(d + 1)
            score.append(score[node] + lp)
            heapq.heappush(heap, (-score[-1], next(order), len(tokens) - 1))
    return Tree.from_lists(tokens, parents, depth, score)


def best_prefix(logp: torch.Tensor, budget: int, root: int) -> Tree:
    """DDTree's draft: the exact ``budget`` most probable prefixes under per-depth marginals.

    A heap of frontier candidates (depth, rank, parent); popping one places it and pushes its
    next sibling (rank + 1 under the same parent) and its first child (rank 0, one deeper).
    """
    _check(logp, budget)
    k = min(budget, logp.shape[1])
    top_lp, top_tok = logp.float().topk(k, dim=-1)  # (D, K)
    top_lp, top_tok = top_lp.cpu().tolist(), top_tok.cpu().tolist()
    depth_max = len(top_lp)
    tokens, parents, depth, score = [root], [-1], [0], [0.0]
    order = itertools.count()
    heap = [(-top_lp[0][0], next(order), 1, 0, 0)]  # (-score, tie, depth, rank, parent)
    while heap and len(tokens) - 1 < budget:
        neg, _, d, r, p = heapq.heappop(heap)
        s = -neg
        tokens.append(top_tok[d - 1][r]); parents.append(p); depth.append(d); score.append(s)
        node = len(tokens) - 1
        if r + 1 < k:
            sib = s - top_lp[d - 1][r] + top_lp[d - 1][r + 1]
            heapq.heappush(heap, (-sib, next(order), d, r + 1, p))
        if d < depth_max:
            heapq.heappush(heap, (-(s + top_lp[d][0]), next(order), d + 1, 0, node))
    return Tree.from_lists(tokens, parents, depth, score)


def _capped_prefixes(gain: Callable[[int, int, bool], float], cap: Callable[[int, int, bool], int],
                     top_tok: list[list[int]], budget: int) -> Tree:
    """Best-first over prefixes: the ``budget`` highest-scoring nodes whose every node's rank is below its
    parent's child cap. A node's score is its parent's plus ``gain(d, r, parent_off_spine)`` (<= 0,
    non-increasing in r), and a node at depth d-1 takes children of ranks < ``cap(d, its rank,
    off_spine)`` only; so popping a node and pushing its next sibling and first child keeps the heap's
    best the best remaining prefix (``best_prefix`` is the uncapped case with gain = head log-prob).
    ``off_spine`` is the parent's path state in ``gain`` (the parent itself included) and the state of
    the path above the parent in ``cap`` (its own rank is the cap's other key)."""
    depth_max, k = len(top_tok), len(top_tok[0])
    tokens, parents, depth, score, rank, off = [0], [-1], [0], [0.0], [0], [False]
    order = itertools.count()
    heap = []

    def push(d, r, p):  # candidate: rank r at depth d under node p, if p's cap and the row allow it
        if d <= depth_max and r < min(k, cap(d, rank[p], off[parents[p]] if p else False)):
            heapq.heappush(heap, (-(score[p] + gain(d, r, off[p])), next(order), d, r, p))

    push(1, 0, 0)
    while heap and len(tokens) - 1 < budget:
        neg, _, d, r, p = heapq.heappop(heap)
        tokens.append(top_tok[d - 1][r]); parents.append(p); depth.append(d); score.append(-neg)
        rank.append(r); off.append(off[p] or r > 0)
        push(d, r + 1, p)
        push(d + 1, 0, len(tokens) - 1)
    return tokens, parents, depth, score


def top2gap(logp: torch.Tensor, budget: int, root: int, width: int = 8, beta: float = 1.0,
            g0: float = 1.0) -> Tree:
    """Top-2-gap fanout (beyond the paper): at most ``max(1, round(W * sigmoid(-beta * (g_d - g0))))``
    children per node at depth d, g_d the gap between depth d's top-1 and top-2 log-probs (a confident
    depth gets few siblings, a flat one up to W), filled best-first by cumulative log-prob."""
    _check(logp, budget)
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    top_lp, top_tok = logp.float().topk(min(max(width, 2), logp.shape[1]), dim=-1)  # (D, W')
    gap = top_lp[:, 0] - top_lp[:, 1] if top_lp.shape[1] > 1 else torch.full((logp.shape[0],), float("inf"))
    caps = torch.sigmoid(-beta * (gap - g0)).mul(width).round().clamp(min=1).long().tolist()  # (D,)
    top_lp, top_tok = top_lp.tolist(), top_tok.tolist()
    tokens, parents, depth, score = _capped_prefixes(lambda d, r, off: top_lp[d - 1][r],
                                                     lambda d, r, off: min(caps[d - 1], width), top_tok, budget)
    return Tree.from_lists([root] + tokens[1:], parents, depth, score)


def _need(profile: "AcceptanceProfile | None", builder: str) -> "AcceptanceProfile":
    if profile is None:
        raise ValueError(f"{builder} needs an acceptance profile (acceptance_profile.json beside the head; "
                         "make one with python -m jetflow profile)")
    return profile


def calibrated_prefix(logp: torch.Tensor, budget: int, root: int, profile: "AcceptanceProfile | None" = None) -> Tree:
    """Best prefixes under measured acceptance (beyond the paper): a node's score is the log of the
    acceptance ``profile`` measured for its head log-prob at its depth, given whether its parent is on
    the argmax spine, so off-spine branches pay for the mismatched context they inherit."""
    _check(logp, budget)
    profile = _need(profile, "calibrated_prefix")
    top_lp, top_tok = logp.float().topk(min(budget, logp.shape[1]), dim=-1)  # (D, K)
    gains = [profile.calibrate(top_lp, s).tolist() for s in (0, 1)]         # 2 x (D, K)
    tokens, parents, depth, score = _capped_prefixes(lambda d, r, off: gains[off][d - 1][r],
                                                     lambda d, r, off: budget, top_tok.tolist(), budget)
    return Tree.from_lists([root] + tokens[1:], parents, depth, score)


def profile_caps(profile: "AcceptanceProfile", budget: int, depths: int) -> torch.Tensor:
    """(2, D+1, R) long: the child cap of a node at depth d (0 = root) with rank r, on or off the spine,
    read off the tree of the ``budget`` best prefixes under the profile's per-(depth, rank) acceptance
    (its expected shape): the most children such a node has there, at least 1 on the spine. The spine
    state is the path's above the node (the node's own rank is the other key)."""
    rates = profile.rank.float().clamp(min=1e-9).log()                     # (2, D', R)
    rows = torch.arange(depths).clamp(max=profile.depths - 1)
    table = rates[:, rows].tolist()                                          # 2 x (D, R)
    n_rank = rates.shape[-1]
    tokens, parents, depth, _ = _capped_prefixes(lambda d, r, off: table[off][d - 1][r],
                                                 lambda d, r, off: n_rank, [list(range(n_rank))] * depths, budget)
    caps = torch.zeros(2, depths + 1, n_rank, dtype=torch.long)
    caps[0, :, 0] = 1
    off, kids = [False] * len(tokens), [0] * len(tokens)
    for i in range(1, len(tokens)):
        off[i] = off[parents[i]] or tokens[i] > 0
        kids[parents[i]] += 1
    for i in range(len(tokens)):
        s, d, r = int(off[parents[i]]) if i else 0, depth[i], tokens[i] if i else 0
        caps[s, d, r] = max(int(caps[s, d, r]), kids[i])
    return caps


def profile_prefix(logp: torch.Tensor, budget: int, root: int, profile: "AcceptanceProfile | None" = None) -> Tree:
    """Per-(depth, rank) child caps from an offline acceptance profile (beyond the paper): each node takes
    at most the children a node of its depth and rank has in the profile's expected tree
    (``profile_caps``), filled best-first by this round's cumulative head log-prob."""
    _check(logp, budget)
    profile = _need(profile, "profile_prefix")
    caps = profile_caps(profile, budget, logp.shape[0]).tolist()           # 2 x (D+1, R)
    n_rank = len(caps[0][0])
    top_lp, top_tok = logp.float().topk(min(n_rank, logp.shape[1]), dim=-1)  # (D, R)
    top_lp = top_lp.tolist()
    tokens, parents, depth, score = _capped_prefixes(
        lambda d, r, off: top_lp[d - 1][r], lambda d, r, off: caps[off][d - 1][r] if r < n_rank else 0,
        top_tok.tolist(), budget)
    return Tree.from_lists([root] + tokens[1:], parents, depth, score)


# ----------------------------------------------------------------------------- per-round budget
class RoundCosts(Protocol):
    """A measured round-cost curve (``CostCurve``, saved beside a head as verify_cost.json)."""

    def round_costs(self, n: int) -> Sequence[float]:
        """Entry k (1 <= k <= n): the cost of a round verifying k tokens, root included; entry 0 unused."""
        ...


def stop_size(gains: list[float], costs: Sequence[float]) -> int:
    """How many of the best-first nodes with expected accepted tokens ``gains`` (non-increasing) a round
    keeps: it grows while the next node raises the expected tokens per unit of round cost, that is while
    ``gains[k] / (costs[k + 2] - costs[k + 1]) >= tau_k / costs[k + 1]`` (its acceptance pays for its
    marginal cost at the rate the tree already earns), with tau_k = 1 + sum(gains[:k]) and ``costs[n]``
    the cost of a round verifying n tokens, root included. At least one node."""
    tau, k = 1.0 + gains[0], 1
    while k < len(gains) and (tau + gains[k]) * costs[k + 1] >= tau * costs[k + 2]:
        tau += gains[k]
        k += 1
    return k


def calibrated_stop(logp: torch.Tensor, budget: int, root: int, profile: "AcceptanceProfile | None" = None,
                    cost: RoundCosts | None = None) -> Tree:
    """Calibrated best prefixes with a per-round budget (beyond the paper): ``calibrated_prefix``'s nodes in
    its best-first order, each worth its calibrated path acceptance (exp of its score, the tokens it adds
    to tau in expectation), kept up to the first one whose acceptance no longer pays for its marginal
    round cost (``stop_size``; ``cost.round_costs(n)``: a measured curve, ``RoundCosts``). So a
    round with a confident draft verifies a large tree and a flat one a small tree, ``budget`` the cap."""
    if cost is None:
        raise ValueError("calibrated_stop needs a round-cost curve (verify_cost.json beside the head; measure "
                         "one with python -m jetflow cost --out HEAD_DIR)")
    tree = calibrated_prefix(logp, budget, root, profile)
    if len(tree) < 2:
        return tree
    k = stop_size(tree.score[1:].exp().tolist(), cost.round_costs(len(tree)))
    return Tree(tree.tokens[:k + 1], tree.parents[:k + 1], tree.depth[:k + 1], tree.score[:k + 1])


def path_prefix(logp: torch.Tensor, budget: int, root: int, paths: torch.Tensor | None = None,
                tail: bool = False) -> Tree:
    """Best prefixes under parent-dependent distributions (beyond the paper): each node at depth d-1 gets
    its own depth-d row, so a node's score is its path's corrected log-prob.

    ``paths`` (D-1, C, C) is the round's table (``jetflow.drafting.correction.path_table``): [d-2, r, c] = log P(the
    c-th of depth d's top-C tokens | its parent is the r-th of depth d-1's); depth 1 reads ``logp``'s top-C.
    Only those C candidates per depth are drafted, unless ``tail``: then each row goes on past them with
    the head's next ranks (up to ``budget``), every such token at its head log-prob plus the row's log
    ratio of leftover mass (corrected over the head's; the correction moves only the candidates' logits,
    so the others keep their proportions), depth 1 takes the head's whole row, and a node outside the
    candidates, which the table has no row for, takes the head's own row (``best_prefix``'s). A heap of
    frontier candidates (depth, place in the parent's row sorted best first, parent); popping one places
    it and pushes its next sibling and its own first child, as ``best_prefix`` does under shared rows."""
    _check(logp, budget)
    if paths is None:
        raise ValueError("path_prefix needs the round's path table (correction.safetensors beside the head; "
                         "train one with python -m jetflow train-correction)")
    c = paths.shape[-1]
    if paths.shape != (logp.shape[0] - 1, c, c) or c > logp.shape[1]:
        raise ValueError(f"paths must be (D-1, C, C) with C <= K for logp {tuple(logp.shape)}, got {tuple(paths.shape)}")
    k = max(c, min(budget, logp.shape[1])) if tail else c
    top_lp, top_tok = logp.float().topk(k, dim=-1)                                   # (D, K')
    head_rows = top_lp.tolist()
    top_tok = top_tok.tolist()
    row_lp, row_col = paths.float().sort(dim=-1, descending=True)                    # (D-1, C, C) best child first
    # log of the mass outside the C candidates, corrected (per parent) and the head's (per depth)
    left = torch.log1p(-paths.float().exp().sum(-1).clamp(max=1 - 1e-7)) - \
        torch.log1p(-top_lp[1:, :c].exp().sum(-1, keepdim=True).clamp(max=1 - 1e-7))  # (D-1, C)
    head_row = lambda d: (head_rows[d - 1], list(range(k)))
    rows: dict[tuple[int, int], tuple[list, list]] = {}  # (depth d, parent column) -> its sorted row, on first use

    def row(d: int, parent_col: int) -> tuple[list, list]:  # depth d's candidates under that parent, best first
        if d == 1 or parent_col >= c:
            return head_row(d) if tail else (head_rows[0][:c], list(range(c)))
        if (d, parent_col) not in rows:
            lps, cols = row_lp[d - 2, parent_col].tolist(), row_col[d - 2, parent_col].tolist()
            if tail and k > c:
                shift = float(left[d - 2, parent_col])
                more = [(lp + shift, j) for j, lp in enumerate(head_rows[d - 1][c:], c)]
                merged = list(heapq.merge(zip(lps, cols), more, key=lambda t: -t[0]))
                lps, cols = [t[0] for t in merged], [t[1] for t in merged]
            rows[d, parent_col] = (lps, cols)
        return rows[d, parent_col]

    depth_max = logp.shape[0]
    tokens, parents, depth, score, col = [root], [-1], [0], [0.0], [0]
    order = itertools.count()
    heap = [(-row(1, 0)[0][0], next(order), 1, 0, 0)]  # (-score, tie, depth, place in row, parent)
    while heap and len(tokens) - 1 < budget:
        neg, _, d, i, p = heapq.heappop(heap)
        lps, cols = row(d, col[p])
        tokens.append(top_tok[d - 1][cols[i]]); parents.append(p); depth.append(d); score.append(-neg)
        col.append(cols[i])
        if i + 1 < len(lps):
            heapq.heappush(heap, (-(score[p] + lps[i + 1]), next(order), d, i + 1, p))
        if d < depth_max:
            heapq.heappush(heap, (-(-neg + row(d + 1, cols[i])[0][0]), next(order), d + 1, 0, len(tokens) - 1))
    return Tree.from_lists(tokens, parents, depth, score)


def path_tail_prefix(logp: torch.Tensor, budget: int, root: int, paths: torch.Tensor | None = None) -> Tree:
    """``path_prefix`` with rows that go on past the C corrected candidates (``tail``): at any budget a
    superset of ``best_prefix``'s choices, the corrected ones where the table has them."""
    return path_prefix(logp, budget, root, paths, tail=True)


@dataclass(frozen=True)
class Builder:
    """A registered tree builder: ``build(logp (D, K), budget, root, **options) -> Tree``. ``options`` names
    the keywords it takes (``width`` for ``accum_logp``); ``bind`` keeps those and drops the rest (a
    chain has no width), so every caller can pass the same keywords."""
    name: str
    build: Callable[..., Tree]
    description: str
    options: tuple[str, ...] = ()

    def bind(self, **options) -> Callable[[torch.Tensor, int, int], Tree]:
        """(logp, budget, root) -> Tree with the options this builder takes fixed."""
        return functools.partial(self.build, **{k: v for k, v in options.items() if k in self.options})


BUILDERS = {b.name: b for b in (
    Builder("chain", chain, "the argmax token at every depth (DFlash)"),
    Builder("accum_logp", accum_logp, "best-first by cumulative log-prob, the top-W tokens under each "
            "expanded node (JetFlow's Algorithm 1)", ("width",)),
    Builder("best_prefix", best_prefix, "the exact budget most probable prefixes (DDTree)"),
    Builder("top2gap", top2gap, "best prefixes under a per-depth child cap that shrinks with the depth's "
            "top-1/top-2 log-prob gap (top2gap fanout)", ("width",)),
    Builder("calibrated_prefix", calibrated_prefix, "best prefixes by measured acceptance: head log-probs "
            "calibrated per depth and spine state", ("profile",)),
    Builder("profile_prefix", profile_prefix, "best prefixes by head log-prob under per-(depth, rank) child "
            "caps from the acceptance profile", ("profile",)),
    Builder("calibrated_stop", calibrated_stop, "calibrated best prefixes, grown while the next node's measured "
            "acceptance pays for its marginal round cost (a per-round budget up to the cap)", ("profile", "cost")),
    Builder("path_prefix", path_prefix, "best prefixes by parent-corrected path log-prob: each node's children "
            "re-scored by the path correction", ("paths",)),
    Builder("path_tail_prefix", path_tail_prefix, "path_prefix whose rows go on past the corrected candidates "
            "with the head's next ranks, rescaled to the row's leftover mass", ("paths",)),
)}


def tree_builder(name: str, **options) -> Callable[[torch.Tensor, int, int], Tree]:
    """(logp (D, K), budget, root) -> Tree for a registered builder, e.g. ``tree_builder("accum_logp",
    width=7)``."""
    if name not in BUILDERS:
        raise ValueError(f"unknown tree builder {name!r}; choose from {', '.join(BUILDERS)}")
    return BUILDERS[name].bind(**options)
