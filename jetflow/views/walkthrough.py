"""One decode round taken apart: the pure pieces notebooks 01 and 03 show at every stage.

- ``TOY_WORDS`` / ``toy_logp()``: a 3-depth, 6-word draft table small enough to grow each builder's
  tree by hand before running it;
- ``acceptance_rows(round)``: the ✅/❌ table along the accepted path, with the target's own choice
  beside every rejected child;
- ``round_logits(target, result, r)``: the target's logits at every node of round r, recomputed
  (a ``Round`` keeps only the argmax), so one can ask what else the target considered at a node;
- ``node_info(tree, logits, node)``: a node's root path, the target's top choices there and its
  verify-mask row;
- ``sample_match(tree, logits, temperature, n)``: sample-and-match repeated ``n`` times on one tree,
  counting the first committed token, to set against the target's own distribution.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from jetflow.engine.decode import verify_step
from jetflow.engine.tree import Tree, ancestor_mask
from jetflow.engine.verify import sample_accept

Decode = Callable[[list[int]], str]

TOY_WORDS = ["<anchor>", "the", "cat", "a", "sat", "dog"]  # token id -> word
TOY_PROBS = [  # depth d -> probability of each word (rows sum to 1; the anchor is never drafted)
    [0.00, 0.55, 0.05, 0.35, 0.00, 0.05],   # depth 1: "the" or "a"
    [0.00, 0.00, 0.50, 0.00, 0.10, 0.40],   # depth 2: "cat" or "dog"
    [0.00, 0.07, 0.05, 0.00, 0.85, 0.03],   # depth 3: "sat"
]


def toy_logp() -> torch.Tensor:
    """(3, 6) log-probs of ``TOY_PROBS`` (-inf where a word has probability 0)."""
    return torch.tensor(TOY_PROBS).log()


def toy_decode(ids: list[int]) -> str:
    """Token ids of the toy table -> words joined by spaces."""
    return " ".join(TOY_WORDS[i] for i in ids)


def _text(token: int, decode: Decode | None) -> str:
    return repr(decode([token])) if decode is not None else str(token)


def acceptance_rows(rnd, decode: Decode | None = None) -> list[dict]:
    """One row per drafted child of every accepted node (the nodes the target compared with its own
    choice), in path order, then the bonus: {depth, node, drafted, verdict ("✅", "❌" or "⭐" for the
    bonus), target (the target's argmax at the parent)}. ``rnd``: anything with ``tree``, ``path``
    and ``target_choice``."""
    tree, path, choice = rnd.tree, list(rnd.path), list(rnd.target_choice)
    kids, tokens, on_path = tree.children(), tree.tokens.tolist(), set(rnd.path)
    rows = []
    for parent in path:
        for child in kids[parent]:
            rows.append({"depth": int(tree.depth[child]), "node": child, "drafted": _text(tokens[child], decode),
                         "verdict": "✅" if child in on_path else "❌", "target": _text(choice[parent], decode)})
    last = path[-1]
    rows.append({"depth": int(tree.depth[last]) + 1, "node": None, "drafted": "-", "verdict": "⭐",
                 "target": _text(choice[last], decode)})
    return rows


@torch.no_grad()
def round_logits(target, result, round_index: int) -> torch.Tensor:
    """(N+1, V) target logits at every node of ``result.rounds[round_index]``, recomputed: prefill the
    prompt and the tokens committed before the round's anchor, then verify the round's tree as the
    decode loop did (greedy rounds only: the anchor is ``result.tokens[before]``)."""
    n = len(result.rounds)
    if not 0 <= round_index < n:
        raise IndexError(f"round_index must be in [0, {n}), got {round_index}")
    before = sum(len(r.committed) for r in result.rounds[:round_index])  # the anchor is tokens[before]
    tree = result.rounds[round_index].tree
    if int(tree.tokens[0]) != result.tokens[before]:
        raise ValueError(f"round {round_index}'s root is not the token committed before it")
    cache = target.new_cache()
    target.forward(torch.tensor(result.prompt_ids + result.tokens[:before]), cache)
    _, step = verify_step(target, tree, cache, ())
    return step.logits


def node_info(tree: Tree, logits: torch.Tensor, node: int, decode: Decode | None = None, top: int = 5) -> dict:
    """What the target saw and thought at ``node``: {node, depth, path (node ids root -> node),
    path_text (their tokens), top ([(token text, probability)] of the target's ``top`` choices for the
    next token), mask_row (the node ids it attends: its ancestors and itself)}."""
    if not 0 <= node < len(tree):
        raise IndexError(f"node must be in [0, {len(tree)}), got {node}")
    if logits.shape[0] != len(tree):
        raise ValueError(f"logits have {logits.shape[0]} rows for a tree of {len(tree)} nodes")
    path = tree.path_to(node)
    tokens = tree.tokens.tolist()
    probs, ids = torch.softmax(logits[node].float(), -1).topk(top)
    return {"node": node, "depth": int(tree.depth[node]), "path": path,
            "path_text": [_text(tokens[i], decode) for i in path],
            "top": [(_text(t, decode), round(p, 4)) for t, p in zip(ids.tolist(), probs.tolist())],
            "mask_row": ancestor_mask(tree.parents)[node].nonzero().flatten().tolist()}


def sample_match(tree: Tree, logits: torch.Tensor, temperature: float, n: int, seed: int = 0) -> dict:
    """Sample-and-match (``verify.sample_accept``) run ``n`` times on one tree and its logits:
    {observed: count per token id of the first committed token (V,), expected: the target's
    softmax(logits[0] / temperature) (V,), accepted: mean drafts accepted, tv: total variation
    distance between observed frequencies and expected}."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    gen = torch.Generator().manual_seed(seed)
    tokens = tree.tokens.tolist()
    counts = torch.zeros(logits.shape[1], dtype=torch.long)
    accepted = 0
    for _ in range(n):
        path, bonus = sample_accept(tree, logits, temperature, gen)
        first = tokens[path[1]] if len(path) > 1 else bonus
        counts[first] += 1
        accepted += len(path) - 1
    expected = torch.softmax(logits[0].float() / temperature, -1)
    tv = 0.5 * float((counts.float() / n - expected).abs().sum())
    return {"observed": counts.tolist(), "expected": expected.tolist(), "accepted": accepted / n, "tv": tv}
