"""The typed candidate ``Tree``, its ancestor mask and positions, and ``merge`` of two trees into one trie.

Pure torch; imports nothing else from jetflow. A tree holds the root (the anchor, index 0)
followed by its draft nodes in insertion order, parents before children, so the budget B is
``len(tree) - 1``. The builders that draft trees live in ``jetflow.drafting.builders``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Tree:
    tokens: torch.Tensor   # (N+1,) long: token id per node, index 0 = root (anchor)
    parents: torch.Tensor  # (N+1,) long: parent index, -1 for the root; parents[i] < i
    depth: torch.Tensor    # (N+1,) long: 0 for the root
    score: torch.Tensor    # (N+1,) float: cumulative draft log-prob, 0 for the root

    def __len__(self) -> int:
        return self.tokens.numel()

    @property
    def budget(self) -> int:
        """Number of draft nodes, excluding the root."""
        return len(self) - 1

    @classmethod
    def from_lists(cls, tokens, parents, depth=None, score=None) -> "Tree":
        """Build a tree from Python lists; depth is derived from parents when omitted."""
        if len(tokens) != len(parents) or not tokens or parents[0] != -1:
            raise ValueError("tokens and parents must have equal length and parents[0] must be -1")
        if any(not (0 <= p < i) for i, p in enumerate(parents) if i):
            raise ValueError("each parent must come before its child")
        if depth is None:
            depth = [0] * len(parents)
            for i in range(1, len(parents)):
                depth[i] = depth[parents[i]] + 1
        score = [0.0] * len(tokens) if score is None else score
        return cls(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long),
                   torch.tensor(depth, dtype=torch.long), torch.tensor(score, dtype=torch.float32))

    def children(self) -> list[list[int]]:
        """children()[i] lists node i's children in insertion order."""
        out: list[list[int]] = [[] for _ in range(len(self))]
        for i, p in enumerate(self.parents.tolist()):
            if p >= 0:
                out[p].append(i)
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node``, both included."""
        parents, path = self.parents.tolist(), [node]
        while parents[path[-1]] >= 0:
            path.append(parents[path[-1]])
        return path[::-1]


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """(N+1, N+1) bool, self-inclusive: mask[i, j] is True when node j is node i or its ancestor. Every node
    climbs one level per step, all at once on the parents' device: depth + 1 steps, not one per node."""
    n = parents.numel()
    rows = torch.arange(n, device=parents.device)
    up = parents.clamp(min=0)  # the root is its own parent here, so a finished climb stays put
    mask = torch.zeros(n, n, dtype=torch.bool, device=parents.device)
    node = rows
    while True:
        mask[rows, node] = True
        nxt = up[node]
        if torch.equal(nxt, node):  # every node has reached the root
            return mask
        node = nxt


def positions(tree: Tree, past_len: int) -> torch.Tensor:
    """(N+1,) absolute position of each node: the root sits right after the cached prefix."""
    return tree.depth + past_len


def merge(first: Tree, second: Tree, budget: int) -> Tree:
    """One trie of at most ``budget`` drafts: ``first``'s nodes (in order), then ``second``'s in its own
    order (best first for ``jetflow.drafting.builders``' trees); a node repeating a (parent, token) pair reuses the
    existing node. Both trees must share the root. Scores are ``second``'s: a node only ``first``
    drafted (which ``second`` did not rank) takes its parent's score."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if int(first.tokens[0]) != int(second.tokens[0]):
        raise ValueError("trees to merge must share the root token")
    n = min(len(first), budget + 1)
    tokens, parents = first.tokens[:n].tolist(), first.parents[:n].tolist()
    index = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents)) if i}
    where, ranked = {0: 0}, {0: 0.0}  # second's node -> merged node; merged node -> second's score
    s_tok, s_par, s_score = second.tokens.tolist(), second.parents.tolist(), second.score.tolist()
    for i in range(1, len(s_tok)):
        if s_par[i] not in where:  # its parent did not fit, so neither does it
            continue
        key = (where[s_par[i]], s_tok[i])
        if key not in index:
            if len(tokens) - 1 >= budget:
                continue
            tokens.append(s_tok[i]); parents.append(key[0])
            index[key] = len(tokens) - 1
        where[i] = index[key]
        ranked[index[key]] = s_score[i]
    score = [0.0] * len(tokens)
    for i in range(1, len(tokens)):
        score[i] = ranked.get(i, score[parents[i]])
    return Tree.from_lists(tokens, parents, score=score)
