"""A decode's rounds as plain JSON, for the tree player (``views.player``) and anything else that wants them.

    res = generate(target, prompt, proposer, budget=16, max_new_tokens=64)
    trace = record(res, target.decode, method="jetflow-pc", budget=16, prompt=prompt)

``record`` keeps what a reader needs to replay every round without a model: each drafted tree (node id,
parent, depth, sibling rank, token id and text), the accepted path, the target's own token after every
accepted node and the bonus, what the round committed, which children the target rejected and what it
wrote there, and the acceptance by depth and sibling rank over all rounds (what ``viz_rounds.branch_acceptance``
counts, here from the JSON rounds, so writing a trace needs no plotly).
Node ids are the tree's indices (root = 0 = the anchor, the token committed before the round).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

FORMAT = "jetflow-trace/1"
REQUIRED = ("format", "method", "budget", "prompt", "text", "tokens", "rounds", "acceptance")
Decode = Callable[[list[int]], str]


def token(tok: int, decode: Decode) -> dict:
    """{token: id, text: its decoded text} (text "" for a token the decoder skips, e.g. EOS)."""
    return {"token": int(tok), "text": decode([int(tok)])}


def _nodes(tree, decode: Decode) -> list[dict]:
    """[{id, parent, depth, rank, token, text}] in tree order; rank = index among its parent's children."""
    kids = tree.children()
    rank = {c: r for cs in kids for r, c in enumerate(cs)}
    parents, depth = tree.parents.tolist(), tree.depth.tolist()
    return [{"id": i, "parent": parents[i], "depth": depth[i], "rank": rank.get(i, 0), **token(t, decode)}
            for i, t in enumerate(tree.tokens.tolist())]


def _bonus(rnd, greedy: bool) -> int | None:
    """The round's bonus token: the last committed one when nothing was cut (EOS, max_new_tokens), else the
    target's argmax after the path under greedy (what it would have committed); None for a cut sampled round."""
    if len(rnd.committed) == len(rnd.path):
        return int(rnd.committed[-1])
    return int(rnd.target_choice[rnd.path[-1]]) if greedy else None


def round_dict(rnd, index: int, decode: Decode, greedy: bool = True) -> dict:
    """One ``decode.Round`` as JSON: {index, nodes, accepted (node ids, root first), target (the target's argmax
    after each accepted node, as tokens), rejected ([{id, target}]: every child of an accepted node off the path,
    with the target's argmax at its parent), bonus (a token, or None), committed (tokens)}."""
    tree, path, choice = rnd.tree, [int(p) for p in rnd.path], list(rnd.target_choice)
    kids, on_path = tree.children(), set(path)
    rejected = [{"id": c, "target": token(choice[p], decode)} for p in path for c in kids[p] if c not in on_path]
    bonus = _bonus(rnd, greedy)
    return {"index": index, "nodes": _nodes(tree, decode), "accepted": path,
            "target": [token(choice[p], decode) for p in path], "rejected": rejected,
            "bonus": None if bonus is None else token(bonus, decode),
            "committed": [token(t, decode) for t in rnd.committed]}


def record(result, decode: Decode, *, method: str, budget: int, prompt: str, temperature: float = 0.0,
           **meta) -> dict:
    """The trace of ``result`` (a ``decode.Result``): {format, method, budget, prompt, temperature, text,
    tokens (ids), first (the prefill's token: the first round's anchor), tau, rounds (``round_dict`` each),
    acceptance ({attempts, accepts}: (D, W) lists, row d-1 = depth d, column = sibling rank)} plus ``meta``
    (e.g. model, dtype). One line in a notebook: ``write_player(record(res, target.decode, method=...,
    budget=16, prompt=p), "tree.html")`` (``jetflow.views.player``)."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    greedy = temperature == 0
    rounds = [round_dict(r, i, decode, greedy) for i, r in enumerate(result.rounds)]
    attempts, accepts = acceptance(rounds)
    return {"format": FORMAT, "method": method, "budget": int(budget), "prompt": prompt,
            "temperature": float(temperature), "text": result.text, "tokens": [int(t) for t in result.tokens],
            "first": token(result.tokens[0], decode), "tau": result.tau,
            "rounds": rounds, "acceptance": {"attempts": attempts, "accepts": accepts}, **meta}


def acceptance(rounds: Sequence[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """(attempts, accepts), both (D, W) nested lists over ``rounds`` (``round_dict`` each): row d-1 is depth d,
    column r the sibling rank. A node is attempted when its parent is on the accepted path (the target compared
    it with its own token) and accepted when it is on the path."""
    hits = []  # (depth, rank, accepted) per attempted node
    for rnd in rounds:
        on_path = set(rnd["accepted"])
        hits += [(n["depth"], n["rank"], n["id"] in on_path) for n in rnd["nodes"] if n["parent"] in on_path]
    depths, ranks = max((h[0] for h in hits), default=0), max((h[1] + 1 for h in hits), default=0)
    attempts = [[0] * ranks for _ in range(depths)]
    accepts = [[0] * ranks for _ in range(depths)]
    for d, r, ok in hits:
        attempts[d - 1][r] += 1
        accepts[d - 1][r] += int(ok)
    return attempts, accepts


def check(trace: dict) -> dict:
    """``trace`` if it has every field the player reads (``REQUIRED``, and nodes/accepted in each round), else a
    ValueError naming what is missing."""
    missing = [k for k in REQUIRED if k not in trace]
    if missing:
        raise ValueError(f"trace lacks {', '.join(missing)} (write it with jetflow.views.trace.record)")
    for rnd in trace["rounds"]:
        lacking = [k for k in ("nodes", "accepted", "rejected", "committed") if k not in rnd]
        if lacking:
            raise ValueError(f"trace round {rnd.get('index', '?')} lacks {', '.join(lacking)}")
    return trace


def depth1_branches(trace: dict) -> Sequence[tuple[int, int, int]]:
    """[(sibling rank, accepted, attempted)] of the root's children over all rounds (row 0 of ``acceptance``)."""
    att, acc = trace["acceptance"]["attempts"], trace["acceptance"]["accepts"]
    return [(r, a, n) for r, (a, n) in enumerate(zip(acc[0], att[0]))] if att else []
