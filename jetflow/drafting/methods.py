"""The method registry: every decoding method of the kit, one frozen entry each, in report order, and
``make_proposer``, the one place that turns a method name into its proposer (drafting's composition root).

Everything that lists methods reads this table: ``make_proposer``, the bench (which methods take a
budget, which run transformers' own ``generate``), replay (the head methods), the report's row order,
the command line's choices and help, and the package docstring. Adding a method is one entry here
plus, when no existing proposer drafts it, its proposer:

    Method("jetflow-chain", "causal head + chain: only the argmax path", head="jetflow", builder="chain",
           beyond_paper=True)

A head method names the kind of head it drafts with (``jetflow``: the causal head, ``dflash``: the
bidirectional one; ``heads={kind: path}`` overrides the shipped head) and a tree builder of
``jetflow.drafting.builders.BUILDERS``; ``lookup_merged`` merges prompt-lookup branches into that tree
(``LookupMerged``). A training-free method builds its proposer from the target with ``proposer``.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from pathlib import Path

import torch

from .checkpoint import check_compatible
from .correction import load_correction
from .cost import load_cost
from .head import DraftHead
from .profile import load_profile
from .proposers import HeadProposer, LookupMerged, LookupProposer, RandomProposer, default_draft_dtype
from .builders import BUILDERS
from jetflow.util.paths import shipped_head_dir


@dataclass(frozen=True)
class Method:
    name: str
    description: str                      # one line, shown in --help and the package docstring
    head: str | None = None               # head kind it drafts with (jetflow | dflash); None: no head
    builder: str | None = None            # tree builder of a head method (jetflow.drafting.builders.BUILDERS)
    lookup_merged: bool = False           # prompt-lookup branches merged into the head's tree
    budget_free: bool = False             # one row without a budget (no draft tree to size)
    beyond_paper: bool = False            # not in the JetFlow paper: an ablation or an addition
    hf_kwargs: tuple[tuple[str, object], ...] | None = None  # transformers generate's own loop, these kwargs
    proposer: Callable | None = None      # target -> proposer, for a training-free method
    correction: str = ""                  # "": the correction in the head's folder; else the one in <head>-<correction>

    def __post_init__(self):
        if (self.head is None) != (self.builder is None):
            raise ValueError(f"{self.name}: a head method needs both a head kind and a tree builder")
        if self.builder is not None and self.builder not in BUILDERS:
            raise ValueError(f"{self.name}: unknown tree builder {self.builder!r}")
        if self.lookup_merged and self.head is None:
            raise ValueError(f"{self.name}: only a head method merges lookup branches")

    @property
    def decodes(self) -> bool:
        """Runs through ``jetflow.generate`` (everything but transformers' own generate)."""
        return self.hf_kwargs is None


def _lookup_merged(base: Method) -> Method:
    """``base``'s tree with prompt-lookup branches merged in (``LookupMerged``)."""
    return replace(base, name=f"{base.name}+lookup", lookup_merged=True, beyond_paper=True,
                   description=f"{base.name}'s tree with prompt-lookup branches merged in")


def _entries(*entries: "Method | str") -> tuple[Method, ...]:
    """The registry in report order; a string ``"X+lookup"`` stands for X's entry with lookup merged in."""
    out: dict[str, Method] = {}
    for e in entries:
        m = _lookup_merged(out[e.removesuffix("+lookup")]) if isinstance(e, str) else e
        out[m.name] = m
    return tuple(out.values())


_REGISTRY = _entries(
    Method("ar", "plain autoregressive decoding through the same loop: the reference", budget_free=True),
    Method("hf", "transformers' own generate (greedy or sampling)", budget_free=True, hf_kwargs=()),
    Method("hf-lookup", "transformers' generate with prompt_lookup_num_tokens=10", budget_free=True,
           hf_kwargs=(("prompt_lookup_num_tokens", 10),)),
    Method("lookup", "training-free n-gram prompt lookup: a trie of what followed earlier matches",
           proposer=lambda target: LookupProposer()),
    Method("random", "random per-depth distributions through accum_logp: a floor, almost nothing accepted",
           proposer=lambda target: RandomProposer(target.config.vocab_size)),
    Method("dflash", "bidirectional head + chain (DFlash)", head="dflash", builder="chain"),
    Method("ddtree", "bidirectional head + best_prefix (DDTree)", head="dflash", builder="best_prefix"),
    Method("jetflow", "causal head + accum_logp (JetFlow's Algorithm 1)", head="jetflow", builder="accum_logp"),
    Method("jetflow-bp", "causal head + best_prefix: tells the head's share of a JetFlow/DDTree gap from "
           "the tree builder's", head="jetflow", builder="best_prefix", beyond_paper=True),
    Method("jetflow-chain", "causal head + chain: only its argmax path, against dflash's chain", head="jetflow",
           builder="chain", beyond_paper=True),
    Method("jetflow-t2g", "causal head + top2gap: best prefixes under a child cap per depth from its top-1/top-2 "
           "gap", head="jetflow", builder="top2gap", beyond_paper=True),
    Method("jetflow-cal", "causal head + calibrated_prefix: best prefixes by the acceptance measured for the "
           "head's log-prob, depth and spine state (acceptance_profile.json)", head="jetflow",
           builder="calibrated_prefix", beyond_paper=True),
    Method("jetflow-profile", "causal head + profile_prefix: per-(depth, rank) child caps from the acceptance "
           "profile, filled by head log-prob", head="jetflow", builder="profile_prefix", beyond_paper=True),
    "ddtree+lookup",
    "jetflow+lookup",
    "jetflow-bp+lookup",
    "jetflow-t2g+lookup",
    "jetflow-cal+lookup",
    "jetflow-profile+lookup",
    Method("jetflow-pc", "causal head + path_prefix: best prefixes by path-corrected log-prob, each node's "
           "children re-scored given its token (correction.safetensors)", head="jetflow", builder="path_prefix",
           beyond_paper=True),
    "jetflow-pc+lookup",
    Method("jetflow-pcx", "causal head + path_tail_prefix: jetflow-pc whose rows go on past the corrected candidates "
           "with the head's next ranks (rescaled to the row's leftover mass), so big budgets reach deeper ranks",
           head="jetflow", builder="path_tail_prefix", beyond_paper=True),
    "jetflow-pcx+lookup",
    # other corrections beside the path one (issue 41), each in its own folder beside the head's
    Method("jetflow-pcb", "jetflow-pc whose children also get a low-rank bigram bias from their parent's token, "
           "trained on top of the frozen path correction (<head>-pcb/correction.safetensors)", head="jetflow",
           builder="path_prefix", beyond_paper=True, correction="pcb"),
    Method("jetflow-pcs", "jetflow-pc whose correction is also fed the head's own first choice at the parent's depth "
           "(what its row assumed), fine-tuned from the path correction (<head>-pcs/correction.safetensors)",
           head="jetflow", builder="path_prefix", beyond_paper=True, correction="pcs"),
    # per-round budget (issue 19, item 4): the calibrated tree cut where one more node costs more than it earns
    Method("jetflow-stop", "causal head + calibrated_stop: jetflow-cal's tree, grown while the next node's measured "
           "acceptance pays for its marginal verify cost (verify_cost.json), the budget a cap", head="jetflow",
           builder="calibrated_stop", beyond_paper=True),
    "jetflow-stop+lookup",
)
METHODS: dict[str, Method] = {m.name: m for m in _REGISTRY}
HEAD_KINDS = tuple(dict.fromkeys(m.head for m in _REGISTRY if m.head))  # ("dflash", "jetflow")
# the methods the README reports (its headline table and takeaways): what notebook 03's explorer offers and 05 reads
REPORTED = ("ar", "lookup", "dflash", "ddtree", "jetflow", "jetflow-bp", "jetflow+lookup", "jetflow-pc", "jetflow-pc+lookup")
assert set(REPORTED) <= set(METHODS)


def method(name: str) -> Method:
    """The registry entry of ``name``; ValueError naming every method otherwise."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")
    return METHODS[name]


def names(where: Callable[[Method], bool] = lambda m: True) -> tuple[str, ...]:
    """Registered method names (in report order) whose entry satisfies ``where``."""
    return tuple(m.name for m in _REGISTRY if where(m))


def check(given: Iterable[str], where: Callable[[Method], bool] = lambda m: True, what: str = "method") -> None:
    """ValueError naming the entries of ``given`` that are not registered methods satisfying ``where``."""
    given, allowed = list(given), names(where)
    bad = [m for m in given if m not in allowed]
    if len(bad) == 1 and len(given) == 1:
        raise ValueError(f"unknown {what} {bad[0]!r}; choose from {', '.join(allowed)}")
    if bad:
        raise ValueError(f"unknown {what}(s) {bad}; choose from {', '.join(allowed)}")


def head_path(name: str, heads: dict[str, str] | None) -> str | None:
    """The head directory or hub id a head method reads from ``heads`` (head kind -> path), else None."""
    kind = method(name).head
    return (heads or {}).get(kind) if kind else None


def help_text(where: Callable[[Method], bool] = lambda m: True) -> str:
    """``a, b or c``: the names for a command-line help string."""
    listed = names(where)
    return listed[0] if len(listed) == 1 else ", ".join(listed[:-1]) + " or " + listed[-1]


def describe() -> str:
    """One line per method, ``name: description`` (marked when beyond the paper), for docstrings."""
    return "\n".join(f"- ``{m.name}``: {m.description}" + (" (beyond the paper)" if m.beyond_paper else "")
                     for m in _REGISTRY)


def load_head(path, dtype: torch.dtype, device, loaded: dict | None = None) -> DraftHead:
    """The ``DraftHead`` at ``path`` (a directory or hub id, any published dialect) in ``dtype`` on ``device``.

    ``loaded``: a dict one run keeps, (path, dtype, device) -> head; a head already in it is returned as is
    (the same object), so methods that draft with the same checkpoint (``dflash`` and ``ddtree`` on z-lab's
    head) hold one copy of its weights. The head is read-only while drafting (its K/V lives in each
    proposer's state), so sharing it changes no output."""
    key = (str(path), dtype, str(torch.device(device)))
    if loaded is not None and key in loaded:
        return loaded[key]
    draft = DraftHead.from_pretrained(str(path), dtype=dtype).to(device)
    if loaded is not None:
        loaded[key] = draft
    return draft


def make_proposer(method: str, target, *, head: str | None = None, width: int = 7,
                  draft_dtype: torch.dtype | None = None, loaded: dict | None = None):
    """Proposer for a registered method (``ar`` -> None): a training-free one from its entry, else its head
    kind's head (``head``: a directory or hub id, default: the head shipped for the embedded target) in
    ``draft_dtype`` (default: ``default_draft_dtype(target)``) under its tree builder, with the acceptance
    profile, the path correction and the cost curve saved beside the head (if any) and lookup branches
    merged in when the entry says so. ``loaded``: heads already read in this run (``load_head``), shared."""
    check([method])
    m = METHODS[method]
    if m.proposer is not None:
        return m.proposer(target)
    if m.head is None:
        if m.decodes:
            return None  # ar: every tree is the root alone
        raise ValueError(f"{method!r} runs transformers' own generate; it has no proposer")
    path = head or shipped_head_dir(m.head)
    draft = load_head(path, draft_dtype or default_draft_dtype(target), target.device, loaded)
    check_compatible(draft.config, target.config)
    correction = load_correction(Path(path).parent / f"{Path(path).name}-{m.correction}" if m.correction else path)
    proposer = HeadProposer(draft, target, m.builder, width, load_profile(path),
                            None if correction is None else correction.to(target.device), load_cost(path))
    return LookupMerged(proposer) if m.lookup_merged else proposer
