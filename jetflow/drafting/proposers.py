"""Proposers: whatever drafts a tree for the decode loop.

Protocol (duck-typed): ``taps`` (target decoder layers the proposer reads, empty if none),
``start(prompt_ids) -> state`` and ``propose(state, tokens, new_taps, budget) -> Tree`` where
``tokens`` are all committed ids (prompt + generated, the anchor last) and ``new_taps``
(T_new, L, H) are the target taps of committed tokens not yet shown to the proposer (None when
``taps`` is empty). The returned tree's root token must be the anchor.

Training-free proposers live here; head-based ones (``jetflow``, ``dflash``, ``ddtree``) too, built
from a trained ``DraftHead``. ``jetflow.drafting.methods.make_proposer`` turns a method name into one.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .compiled_draft import CompiledPass
from .correction import PathCorrection, candidates, path_table
from .head import HeadState
from jetflow.engine.tree import Tree, merge
from .builders import BUILDERS, AcceptanceProfile, accum_logp, tree_builder


@dataclass
class RandomProposer:
    """Random per-depth distributions through Algorithm 1: almost nothing is ever accepted."""
    vocab_size: int
    depths: int = 15
    width: int = 4
    seed: int = 0
    taps: tuple = ()

    def start(self, prompt_ids):
        return torch.Generator().manual_seed(self.seed)

    def propose(self, gen, tokens, new_taps, budget) -> Tree:
        logp = torch.log_softmax(torch.randn(self.depths, self.vocab_size, generator=gen) * 3, -1)
        return accum_logp(logp, budget, tokens[-1], self.width)


@dataclass
class OracleProposer:
    """Replays a known continuation (e.g. the AR output) as a chain; everything is accepted.

    ``wrong_at=j`` replaces the depth-j token with a wrong one, so exactly j-1 drafts are
    accepted per round; ``siblings`` adds that many wrong siblings at every depth (a bushy tree).
    """
    continuation: list[int]
    vocab_size: int
    wrong_at: int | None = None
    siblings: int = 0
    taps: tuple = ()

    def start(self, prompt_ids):
        return len(prompt_ids)

    def propose(self, prompt_len, tokens, new_taps, budget) -> Tree:
        done = len(tokens) - prompt_len  # generated so far, anchor included
        truth = self.continuation[done:done + budget]
        tok, par, spine = [tokens[-1]], [-1], 0
        for d, t in enumerate(truth, start=1):
            if len(tok) - 1 >= budget:
                break
            tok.append((t + 1) % self.vocab_size if d == self.wrong_at else t); par.append(spine)
            parent, spine = spine, len(tok) - 1
            for s in range(1, self.siblings + 1):
                if len(tok) - 1 < budget:
                    tok.append((t + 7 * s) % self.vocab_size); par.append(parent)
        return Tree.from_lists(tok, par)


@dataclass
class LookupProposer:
    """Training-free n-gram prompt lookup (the idea behind transformers' prompt_lookup_num_tokens).

    Finds earlier occurrences of the longest suffix n-gram (``max_ngram`` down to ``min_ngram``)
    in the committed tokens and drafts what followed them; up to ``max_matches`` different
    continuations (most recent first) are merged into a trie, ``max_len`` tokens deep.
    """
    max_ngram: int = 3
    min_ngram: int = 1
    max_matches: int = 4
    max_len: int = 10
    taps: tuple = ()

    @property
    def max_drafts(self) -> int:
        """No tree holds more nodes than this, whatever the budget."""
        return self.max_matches * self.max_len

    def start(self, prompt_ids):
        return None

    def _continuations(self, tokens: list[int]) -> list[list[int]]:
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            key, found = tokens[-n:], []
            for i in range(len(tokens) - n - 1, -1, -1):  # most recent first, never the suffix itself
                if tokens[i:i + n] == key:
                    found.append(tokens[i + n:i + n + self.max_len])
                    if len(found) == self.max_matches:
                        break
            if found:
                return found
        return []

    def propose(self, state, tokens, new_taps, budget) -> Tree:
        tok, par, index = [tokens[-1]], [-1], {}  # index: (parent node, token) -> node
        for cont in self._continuations(tokens):
            node = 0
            for t in cont:
                if (node, t) not in index:
                    if len(tok) - 1 >= budget:
                        break
                    tok.append(t); par.append(node); index[(node, t)] = len(tok) - 1
                node = index[(node, t)]
        return Tree.from_lists(tok, par)


@dataclass
class HeadDraftState:
    """Decoding state of a head proposer: the head's cached context K/V (None before the prompt)."""
    head: HeadState | None = None


def default_draft_dtype(target) -> torch.dtype:
    """bf16 where it is fast (CUDA, or a CPU with AVX-512 BF16/AMX), else the target's dtype.

    The draft's precision never touches losslessness (the target verifies every token in its own
    dtype); on this kind of CPU an fp32 lm_head over 15 rows costs most of an fp32 AR step, bf16 ~1/7."""
    if target.device.type == "cuda" or (target.device.type == "cpu"
                                         and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return torch.bfloat16
    return target.dtype


@dataclass
class HeadProposer:
    """A trained draft head plus a tree builder: ``jetflow`` (causal head + Algorithm 1),
    ``dflash`` (bidirectional head + chain), ``ddtree`` (bidirectional head + best prefixes),
    ``jetflow-bp`` (causal head + best prefixes).

    The head runs in its own dtype (``head.dtype``); the target's embedding and the lm_head rows of the
    head's draft vocabulary are copied once into that dtype. ``profile`` is the acceptance profile saved
    beside the head (``jetflow.drafting.profile``), for the builders that take one; ``correction`` the path
    correction saved beside it (``jetflow.drafting.correction``), for ``path_prefix``."""
    head: torch.nn.Module
    target: object
    builder: str = "accum_logp"
    width: int = 7
    profile: AcceptanceProfile | None = None
    correction: PathCorrection | None = None
    cost: object | None = None  # cost.CostCurve saved beside the head, for the builders that take one
    embed: torch.Tensor = field(init=False, repr=False)   # (V, H) the target's embedding, head dtype
    out: torch.Tensor = field(init=False, repr=False)     # (K, H) its lm_head rows of the draft vocabulary
    vocab: torch.Tensor | None = field(init=False, repr=False)  # (K,) draft columns -> token ids, on CPU

    def __post_init__(self):
        model, dtype = self.target.model, self.head.dtype
        self.embed = model.get_input_embeddings().weight.detach().to(dtype)
        self.out = self.head.output_weight(model.get_output_embeddings().weight.detach()).to(dtype).contiguous()
        self.vocab = None if self.head.vocab is None else self.head.vocab.cpu()

    @property
    def taps(self) -> tuple:
        return tuple(self.head.config.target_layer_ids)

    @property
    def max_drafts(self) -> int | None:
        """A chain holds at most D = Q-1 drafts (block size Q); trees grow with the budget (None)."""
        return self.head.config.block_size - 1 if self.builder == "chain" else None

    def start(self, prompt_ids) -> HeadDraftState:
        return HeadDraftState()

    def depth_logp(self, state: HeadDraftState, tokens, new_taps) -> torch.Tensor:
        """(D, K) fp32 draft log-probs for depths 1..D after feeding the new taps; column i is
        token ``head.vocab[i]`` (token i when the head drafts the whole vocabulary, K = V)."""
        return self.logp(self.depth_hidden(state, tokens, new_taps))

    def depth_hidden(self, state: HeadDraftState, tokens, new_taps, depth: int | None = None) -> torch.Tensor:
        """(D, H) the head's final states for depths 1..D (head dtype), after feeding the new taps; ``depth``: at
        least depths 1..depth (a causal head drafts only those: ``DraftHead.draft_block``)."""
        state.head = self.head.extend(state.head, new_taps.to(self.head.dtype))
        return self.head.draft_block(state.head, tokens[-1], self.embed, depth)

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final head states (..., H) -> fp32 log-probs over the draft vocabulary (..., K)."""
        return torch.log_softmax(F.linear(hidden, self.out).float(), dim=-1)

    def paths(self, hidden: torch.Tensor, logp: torch.Tensor, cols: torch.Tensor | None = None,
              budget: int | None = None) -> torch.Tensor | None:
        """The path correction's table (..., D-1, C', C') for head states (..., D, H) and log-probs (..., D, K')
        (``correction.path_table``), C' = ``correction.table_size(budget)``; ``cols`` (..., D, K') are logp's
        draft columns when it holds only some (replay's top-k); None without a correction."""
        if self.correction is None:
            return None
        lp, idx = candidates(logp, self.correction.table_size(budget))              # (..., D, C')
        col = idx if cols is None else cols.to(idx.device).gather(-1, idx)
        ids = col if self.vocab is None else self.vocab.to(col.device)[col]
        return path_table(self.correction, hidden, lp, ids, self.out[col], self.embed)

    def propose(self, state: HeadDraftState, tokens, new_taps, budget) -> Tree:
        hidden = self.depth_hidden(state, tokens, new_taps, budget)[:budget]  # budget drafts reach no deeper
        logp = self.logp(hidden)
        paths = self.paths(hidden, logp, budget=budget) if "paths" in BUILDERS[self.builder].options else None
        build = tree_builder(self.builder, width=self.width, profile=self.profile, paths=paths,
                             cost=self.cost)
        tree = build(logp, budget, tokens[-1])
        if self.vocab is None:
            return tree
        ids = tree.tokens.clone()
        ids[1:] = self.vocab[ids[1:]]  # draft-vocabulary columns -> token ids (the root is the anchor)
        return dataclasses.replace(tree, tokens=ids)

    def compiled_for(self, target) -> "HeadProposer":
        """Hook of a compiled ``target`` (``CompiledTarget.draft_proposer``): this proposer's twin whose head
        draft pass runs compiled."""
        return CompiledHeadProposer.twin(self, target)


class CompiledHeadProposer(CompiledPass, HeadProposer):
    """A ``HeadProposer`` whose draft pass runs compiled (``jetflow.drafting.compiled_draft.CompiledPass``)."""


@dataclass
class LookupMerged:
    """Beyond the paper: a head proposer's tree with prompt-lookup continuations merged in.

    The n-gram lookup trie goes in first (at most ``share`` x budget nodes; none when the suffix has
    no earlier match), then the head's tree fills the rest of the budget best first, a node both drafted
    counting once. Copying spans of the prompt or of the answer so far is what lookup is good at and a
    small head is not, so the two miss different tokens. Verification is unchanged, so it stays lossless."""
    inner: HeadProposer
    share: float = 0.5
    lookup: LookupProposer = field(default_factory=LookupProposer)

    def __post_init__(self):
        if not 0 < self.share <= 1:
            raise ValueError(f"share must be in (0, 1], got {self.share}")

    @property
    def taps(self) -> tuple:
        return self.inner.taps

    @property
    def head(self):
        return self.inner.head

    max_drafts = None  # the head's tree grows with the budget

    def start(self, prompt_ids) -> HeadDraftState:
        return self.inner.start(prompt_ids)

    def merged(self, tokens, drafted: Tree, budget: int) -> Tree:
        """``drafted`` (the head's tree) with the lookup trie of ``tokens`` merged in first."""
        found = self.lookup.propose(None, tokens, None, max(1, int(budget * self.share)))
        return merge(found, drafted, budget)

    def propose(self, state: HeadDraftState, tokens, new_taps, budget) -> Tree:
        return self.merged(tokens, self.inner.propose(state, tokens, new_taps, budget), budget)

    def compiled_for(self, target) -> "LookupMerged":
        """Hook of a compiled ``target``: this merge around its inner proposer's compiled twin."""
        return dataclasses.replace(self, inner=target.draft_proposer(self.inner))


    def warmup(self, up_to: int | None = None, shortest: int = 1) -> dict[int, float]:
        """Its inner proposer's draft-pass warmup (a compiled twin's ``CompiledPass.warmup``), or nothing."""
        hook = getattr(self.inner, "warmup", None)
        return hook(up_to, shortest) if hook is not None else {}
