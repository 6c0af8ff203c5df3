"""Lossless tree verification (docs/method.md, Verification): masks, acceptance rules, cache compaction.

Pure torch; imports only ``jetflow.engine.tree``. The target forward itself lives in ``decode.py``:
this module turns a tree into what that forward needs and its logits into an accepted path.
"""
from __future__ import annotations

import torch

from .tree import Tree, ancestor_mask


def tree_attention_mask(tree: Tree, past_len: int, dtype: torch.dtype = torch.float32,
                        device: torch.device | str | None = None) -> torch.Tensor:
    """(1, 1, N+1, past_len + N+1) additive mask: every node sees the whole cached prefix,
    and inside the tree exactly its ancestors and itself. Built on ``device`` (the target's; default the
    tree's), so a GPU round copies the parents (N+1 integers) rather than the whole mask."""
    device = tree.parents.device if device is None else torch.device(device)
    n = len(tree)
    mask = torch.zeros(n, past_len + n, dtype=dtype, device=device)
    inside = ancestor_mask(tree.parents.to(device))  # (N+1, N+1), vectorised on the device
    mask[:, past_len:].masked_fill_(~inside, torch.finfo(dtype).min)
    return mask[None, None]


def _follow(tree: Tree, choice: list[int]) -> list[int]:
    """Walk from the root, stepping to the child whose token equals ``choice[node]``."""
    tokens, kids = tree.tokens.tolist(), tree.children()
    path = [0]
    while True:
        nxt = next((c for c in kids[path[-1]] if tokens[c] == choice[path[-1]]), None)
        if nxt is None:
            return path
        path.append(nxt)


def greedy_accept(tree: Tree, logits: torch.Tensor, choice: list[int] | None = None) -> tuple[list[int], int]:
    """Longest root path whose every token is the target's argmax at its parent.

    logits: (N+1, V) target logits per node (``choice``, their argmax per node, when the caller
    has it already). Returns (accepted node indices starting with the root, bonus token = argmax
    at the last accepted node).
    """
    choice = logits.argmax(dim=-1).tolist() if choice is None else choice
    path = _follow(tree, choice)
    return path, choice[path[-1]]


def sample_accept(tree: Tree, logits: torch.Tensor, temperature: float,
                  generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Sample-and-match: draw one target token at every node, follow matching children.

    Each committed token is the target's own sample at its parent, so the output is distributed
    exactly as plain sampling whatever the tree holds. (Chain-style min(1, p/q) is not used: with
    siblings it is not lossless.)
    """
    if not 0 < temperature < float("inf"):  # also refuses NaN
        raise ValueError(f"temperature must be finite and > 0 for sampling, got {temperature}")
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    choice = torch.multinomial(probs, 1, generator=generator).squeeze(-1).tolist()
    path = _follow(tree, choice)
    return path, choice[path[-1]]


def kept_positions(past_len: int, path: list[int]) -> torch.Tensor:
    """Cache rows to keep after a round: the prefix plus the accepted nodes, in path order."""
    return torch.cat([torch.arange(past_len), past_len + torch.tensor(path, dtype=torch.long)])
