"""The decode loop: prefill, then rounds of draft -> verify -> accept -> commit.

``generate`` works with any proposer (see ``proposers.py``); with ``proposer=None`` every tree is
the root alone, which is plain autoregressive decoding through the very same seam, so baselines
share every line of code that is not drafting.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from .metrics import tau
from .target import Target, check_supported, keep_path
from .tree import Tree
from .verify import greedy_accept, sample_accept, tree_attention_mask


@dataclass
class Round:
    tree: Tree             # what was drafted (root = anchor)
    path: list[int]        # accepted node indices, root first
    committed: list[int]   # tokens committed this round: accepted drafts + bonus (after truncation)
    target_choice: list[int]  # (N+1,) the target's argmax at every node
    draft_s: float
    verify_s: float

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the bonus excluded)."""
        return len(self.path) - 1


@dataclass
class Result:
    prompt_ids: list[int]
    tokens: list[int]      # generated ids (EOS included when hit)
    text: str
    rounds: list[Round] = field(default_factory=list)
    prefill_s: float = 0.0
    compile_s: float = 0.0  # a compiled target's warmup in this call (graphs compiled or loaded), never timed

    @property
    def new_tokens(self) -> int:
        return len(self.tokens)

    @property
    def decode_s(self) -> float:
        return sum(r.draft_s + r.verify_s for r in self.rounds)

    @property
    def draft_s(self) -> float:
        return sum(r.draft_s for r in self.rounds)

    @property
    def verify_s(self) -> float:
        return sum(r.verify_s for r in self.rounds)

    @property
    def tau(self) -> float:
        """Mean tokens committed per round, bonus included (docs/method.md, Vocabulary and conventions)."""
        return tau(self.rounds) or 0.0

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: tokens committed by rounds over decode time (prefill excluded)."""
        return sum(len(r.committed) for r in self.rounds) / max(self.decode_s, 1e-9)


def _check_args(target: Target, prompt_len: int, budget: int, max_new_tokens: int, temperature: float):
    if budget < 1:
        raise ValueError(f"budget must be >= 1, got {budget}")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    check_temperature(temperature)
    need = prompt_len + max_new_tokens + budget + 1
    if need > target.max_context:
        raise ValueError(f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) + budget "
                         f"+ 1 ({need} rows) exceeds {target.context_limit}")


def check_temperature(temperature: float, name: str = "temperature") -> None:
    """Temperature must be a finite number >= 0 (NaN slips past ``< 0`` and would sample garbage)."""
    if not isinstance(temperature, (int, float)) or not math.isfinite(temperature) or temperature < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {temperature!r}")


def check_tree(tree: Tree, anchor: int, budget: int, vocab_size: int, proposer) -> None:
    """What a proposer hands ``generate`` must be a tree it can verify: the root is the anchor, every
    parent comes before its child, depth = parent's depth + 1, at most ``budget`` drafts, ids in the
    vocabulary. A violation names the proposer: verifying such a tree would read the wrong cache rows."""
    name = type(proposer).__name__
    tokens, parents, depth = tree.tokens.cpu(), tree.parents.cpu(), tree.depth.cpu()
    n = tokens.numel()
    problem = None
    if n == 0 or int(tokens[0]) != anchor or int(parents[0]) != -1 or int(depth[0]) != 0:
        problem = f"its root must be the anchor token {anchor} with parent -1 and depth 0"
    elif n - 1 > budget:
        problem = f"it drafted {n - 1} nodes, over the budget of {budget}"
    elif ((parents[1:] < 0) | (parents[1:] >= torch.arange(1, n))).any():
        problem = "every node's parent must come before it (parents first)"
    elif (depth[1:] != depth[parents[1:]] + 1).any():
        problem = "every node's depth must be its parent's depth + 1"
    elif ((tokens < 0) | (tokens >= vocab_size)).any():
        problem = f"its token ids must lie in [0, {vocab_size})"
    if problem is not None:
        raise ValueError(f"proposer {name} returned a tree generate cannot verify: {problem}")


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> int:
    if temperature == 0:
        return int(logits.argmax())
    return int(torch.multinomial(torch.softmax(logits.float() / temperature, -1), 1, generator=gen))


def _commit(out: list[int], tokens: list[int], eos: set[int], max_new: int) -> list[int]:
    """Append tokens to ``out`` up to the first EOS or ``max_new``; return what was appended."""
    taken = []
    for tok in tokens:
        if len(out) >= max_new or (out and out[-1] in eos):
            break
        out.append(tok)
        taken.append(tok)
    return taken


def _root_only(anchor: int) -> Tree:
    return Tree.from_lists([anchor], [-1])


def verify_step(target: Target, tree: Tree, cache, taps: tuple[int, ...]):
    """One verify forward of ``tree`` after the cached prefix -> (prefix length, Step)."""
    past = cache.get_seq_length()
    mask = None if len(tree) == 1 else tree_attention_mask(tree, past, target.dtype, target.device)
    return past, target.forward(tree.tokens, cache, positions=tree.depth + past, mask=mask, taps=taps)


def _warm(target: Target, proposer, rows: int, budget: int, max_new_tokens: int) -> float:
    """A compiled target's warmup before the clock starts (``CompiledTarget.warm``): every graph this decode can
    reach, so no round compiles; the seconds it took (0 on an eager or already warm target)."""
    if not hasattr(target, "warm"):
        return 0.0
    return sum(r["seconds"] for r in target.warm([proposer] if proposer is not None else [], rows=rows,
                                                  tree=budget + 1 if proposer is not None else 1,
                                                  shortest=rows - max_new_tokens))


@torch.no_grad()
def generate(target: Target, prompt, proposer=None, *, budget: int = 16, max_new_tokens: int = 256,
             temperature: float = 0.0, seed: int | None = None) -> Result:
    """Speculative decoding of ``prompt`` (text through the chat template, or a 1-D id tensor).

    ``proposer=None`` decodes autoregressively (one root-only tree per round). Greedy output equals
    plain greedy decoding; with temperature > 0 each token is the target's own sample.
    """
    ids = target.encode(prompt) if isinstance(prompt, str) else torch.as_tensor(prompt).long().flatten()
    _check_args(target, ids.numel(), budget, max_new_tokens, temperature)
    check_supported(target.model, repr(target.name))
    # the generator lives where the logits are: a CPU generator cannot sample CUDA probabilities
    gen = torch.Generator(device=target.device).manual_seed(seed) if seed is not None else None
    if hasattr(target, "draft_proposer"):  # a compiled target compiles a head's draft pass too
        proposer = target.draft_proposer(proposer)
    taps = tuple(getattr(proposer, "taps", ())) if proposer is not None else ()
    warmed = _warm(target, proposer, ids.numel() + max_new_tokens, budget, max_new_tokens)

    t0 = time.perf_counter()
    cache = target.new_cache()
    step = target.forward(ids, cache, taps=taps, last_only=True)  # the prefill: only its last logits are read
    out = [_pick(step.logits[-1], temperature, gen)]
    result = Result(prompt_ids=ids.tolist(), tokens=out, text="", prefill_s=time.perf_counter() - t0,
                    compile_s=warmed)
    state = proposer.start(ids) if proposer is not None else None
    new_taps = step.taps
    while len(out) < max_new_tokens and out[-1] not in target.eos_ids:
        t1 = time.perf_counter()
        if proposer is None:
            tree = _root_only(out[-1])
        else:
            tree = proposer.propose(state, result.prompt_ids + out, new_taps, budget)
            check_tree(tree, out[-1], budget, target.config.vocab_size, proposer)
        t2 = time.perf_counter()
        past, step = verify_step(target, tree, cache, taps)
        choice = step.logits.argmax(-1).tolist()  # the target's greedy pick at every node (kept in Round)
        if temperature == 0:
            path, bonus = greedy_accept(tree, step.logits, choice)
        else:
            path, bonus = sample_accept(tree, step.logits, temperature, gen)
        keep_path(cache, past, path)
        new_taps = step.taps[path] if taps else None
        committed = _commit(out, tree.tokens[path[1:]].tolist() + [bonus], target.eos_ids, max_new_tokens)
        result.rounds.append(Round(tree, path, committed, choice, t2 - t1, time.perf_counter() - t2))
    result.text = target.decode(out)
    return result
