"""A head proposer's draft pass compiled: the head's block pass and its draft log-probs as one frozen graph
per context bucket, on a compiled target (``jetflow.engine.compiled``).

The head's context grows every round, so its cached K/V are zero-padded up to the next of
``CompileConfig.head_contexts`` and the pad columns masked (``training_mask`` over the bucket: a block sees only
the rows before its anchor). ``CompiledPass`` turns a head proposer into its compiled twin; a compiled target
gets the twin through the proposer's duck hook ``compiled_for(target)`` (``proposers.CompiledHeadProposer``).
"""
from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F

from jetflow.engine.compiled import CompileConfig, call_frozen, timed_first_call, warmed_size
from .head import HeadState, block_positions, training_mask


class _DraftPass(torch.nn.Module):
    """A head's block pass and its draft log-probs as one module, so freezing folds the head's weights
    and the lm_head rows of its draft vocabulary alike."""

    def __init__(self, head: torch.nn.Module, out: torch.Tensor):
        super().__init__()
        self.head = head
        self.register_buffer("out", out, persistent=False)

    def forward(self, x, positions, ctx_kv, mask) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``head.draft_block(...)`` and ``HeadProposer.logp`` of it: the final states (D, H) of slots
        1..D (head dtype) and their (D, K) fp32 log-probs."""
        hidden = self.head(x, positions, ctx_kv, mask)[0, 1:]
        return hidden, torch.log_softmax(F.linear(hidden, self.out).float(), dim=-1)


def _padded_rows(t: torch.Tensor, rows: int) -> torch.Tensor:
    """(..., n, d) -> (..., rows, d), zeros after row n; always a fresh contiguous tensor (one layout,
    so the graph's stride guards never fail)."""
    out = t.new_zeros(*t.shape[:-2], rows, t.shape[-1])
    out[..., :t.shape[-2], :] = t
    return out


class CompiledDraft:
    """A head's draft pass compiled: one graph per context bucket (``CompileConfig.head_contexts``)."""

    def __init__(self, head: torch.nn.Module, out: torch.Tensor, config: CompileConfig):
        self.head, self.config = head, config
        self.device = head.fc.weight.device
        self.module = _DraftPass(head, out).eval()
        self.graphs: dict[int, object] = {}
        self.compile_s: dict[int, float] = {}  # context bucket -> seconds of its first call

    def inputs(self, state: HeadState, anchor_token: int, embed: torch.Tensor) -> tuple:
        """The graph's inputs: block rows, positions, the context K/V zero-padded to the bucket and the
        mask over it (pad columns lie past the anchor, so ``training_mask`` hides them)."""
        c, n = self.head.config, state.n_ctx
        size = warmed_size(self.compile_s, n, self.config.context)  # the next compiled bucket, else the next one
        anchors = torch.tensor([n], device=self.device)
        x = self.head.block_inputs(torch.tensor([anchor_token]), embed).to(self.device, self.head.dtype)
        kv = [tuple(_padded_rows(t, size) for t in layer) for layer in state.kv]
        mask = training_mask(anchors, size, c.block_size, c.causal)[None]     # (1, Q, size + Q)
        return x, block_positions(anchors, c.block_size)[None], kv, mask

    @torch.no_grad()
    def __call__(self, state: HeadState, anchor_token: int, embed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden (D, H), fp32 draft log-probs (D, K)) for depths 1..D: the eager ``draft_block`` and
        ``HeadProposer.logp`` after extend, in one graph."""
        args = self.inputs(state, anchor_token, embed)
        size = args[3].shape[-1] - self.head.config.block_size
        if size not in self.graphs:
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            self.graphs[size] = torch.compile(self.module, dynamic=False, mode=mode)
        out = timed_first_call(self.compile_s, size, self.device,
                               lambda: call_frozen(self.graphs[size], self.config.freezing, self.device, *args))
        return tuple(t.clone() for t in out) if self.device.type == "cuda" else out

    @torch.no_grad()
    def warmup(self, embed: torch.Tensor, up_to: int | None = None, shortest: int = 1) -> dict[int, float]:
        """Compile (or load) the graph of the context bucket holding ``up_to`` rows (a run's longest context;
        every shorter context pads up to it), or with ``up_to`` None every bucket from the one holding
        ``shortest`` rows, on a throwaway one-row context (shapes, not values, pick the graph); returns
        {bucket: seconds of its first call}."""
        buckets = self.config.head_contexts
        if up_to is not None:  # one graph: every context of the run pads up to it (``warmed_size``)
            buckets = (self.config.context(max(1, up_to)),)
        else:
            buckets = buckets[buckets.index(self.config.context(max(1, shortest))):]
        rows = torch.zeros(1, self.head.fc.in_features, device=self.device)
        one = self.head.extend(None, rows.reshape(1, 1, -1))
        for size in buckets:
            if size not in self.compile_s:
                self(HeadState(one.kv, size), 0, embed)
        return {s: self.compile_s[s] for s in buckets}


def shared_draft(target, head: torch.nn.Module, out: torch.Tensor) -> CompiledDraft:
    """The compiled draft pass of ``head`` (scored by ``out``) on the compiled ``target``: one per head, kept
    in the target's engine, so every proposer over one head shares its graphs."""
    drafts = target.engine.drafts
    if id(head) not in drafts:
        drafts[id(head)] = CompiledDraft(head, out, target.engine.config)
    return drafts[id(head)]


class CompiledPass:
    """Mixin for a head proposer (``head``, ``embed``, ``out``, ``depth_hidden``, ``logp``) whose draft pass
    runs compiled (``CompiledDraft``); trees, taps and the path correction as eager. The graph yields the head
    states and their log-probs together: ``logp`` of the states ``depth_hidden`` just returned is the graph's
    own. ``proposers.CompiledHeadProposer`` is ``HeadProposer`` with it."""
    draft: CompiledDraft | None = None
    _last: tuple | None = None  # (hidden, logp) of the last pass

    @classmethod
    def twin(cls, proposer, target) -> "CompiledPass":
        """A ``cls`` with ``proposer``'s init fields, on the compiled draft pass of its head for ``target``."""
        twin = cls(**{f.name: getattr(proposer, f.name) for f in dataclasses.fields(cls) if f.init})
        twin.draft = shared_draft(target, twin.head, twin.out)
        return twin

    def compiled_for(self, target) -> None:
        """Compiled already: no twin."""
        return None

    def warmup(self, up_to: int | None = None, shortest: int = 1) -> dict[int, float]:
        """``CompiledDraft.warmup`` of this twin's draft pass: the context buckets from ``shortest`` to ``up_to`` rows."""
        return self.draft.warmup(self.embed, up_to, shortest)

    def depth_hidden(self, state, tokens, new_taps, depth: int | None = None) -> torch.Tensor:
        """As ``HeadProposer.depth_hidden``; the graph always runs the whole block (one shape), so ``depth`` cuts
        nothing here."""
        state.head = self.head.extend(state.head, new_taps.to(self.head.dtype))
        self._last = self.draft(state.head, tokens[-1], self.embed)
        return self._last[0]

    def logp(self, hidden: torch.Tensor) -> torch.Tensor:
        last = self._last
        if last is not None and hidden.data_ptr() == last[0].data_ptr() and hidden.shape[1:] == last[0].shape[1:] \
                and hidden.shape[0] <= last[0].shape[0]:  # the graph's states or their first rows
            return last[1] if hidden.shape[0] == last[0].shape[0] else last[1][:hidden.shape[0]]
        return super().logp(hidden)
